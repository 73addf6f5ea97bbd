// What the library of fp4lab's CPU kernels was built for: set by the install-time build
// (setup.py) as fp4lab.core.kernel_build.built_for() gives it, "<jaxlib version>
// ffi-<major>.<minor> <sha256 of the kernels' sources and headers>", so a process loads an
// installed library only for these sources and an FFI API it can call (else it builds them
// on first use). Empty in a library built on first use.

#ifndef FP4LAB_BUILT_FOR
#define FP4LAB_BUILT_FOR ""
#endif

extern "C" const char* fp4lab_kernels_built_for() { return FP4LAB_BUILT_FOR; }
