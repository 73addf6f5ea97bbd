// What the library of fp4lab's CPU kernels was built for: set by the install-time build
// (setup.py) as "<jaxlib version> <sha256 of the kernels' sources>", so fp4lab.core.cpu_kernels
// loads an installed library only for the jaxlib and the sources it was built from (else it
// builds them on first use). Empty in a library built on first use.

#ifndef FP4LAB_BUILT_FOR
#define FP4LAB_BUILT_FOR ""
#endif

extern "C" const char* fp4lab_kernels_built_for() { return FP4LAB_BUILT_FOR; }
