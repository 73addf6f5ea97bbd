// Step reports out of a compiled training run, without a host callback: the kernel appends each
// report to a queue in this library and the host drains it (fp4lab.sweep.step_reports: report_step
// and take_reports). Built into the one library of fp4lab's CPU kernels (fp4lab.core.kernel_build).
// A program that calls it is an ordinary XLA program, so jax's persistent cache
// and jax.export keep it, which they do not for a program with a Python callback.
//
// Inputs (a vmapped call adds leading batch axes, the same on all three): done int32 (...), the
// steps done; run uint32 (..., R), the run's stream key data (tells the seeds of a call apart);
// values float32 (..., V), the step's outputs. Output: int32 (...), zeros (XLA wants a result;
// the call is marked as having a side effect, so it is never removed or merged).
// It reads its inputs and writes nothing the program reads: results are those of the program
// without it, bit for bit.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Queue {
  std::mutex lock;
  int64_t run_words = 0;     // R of the reports queued (0 while empty)
  int64_t value_words = 0;   // V
  std::vector<int32_t> done;
  std::vector<uint32_t> run;
  std::vector<float> values;
};

Queue& queue() {
  static Queue q;
  return q;
}

ffi::Error Report(ffi::Buffer<ffi::S32> done, ffi::Buffer<ffi::U32> run,
                  ffi::Buffer<ffi::F32> values, ffi::ResultBuffer<ffi::S32> out) {
  const auto rd = run.dimensions(), vd = values.dimensions();
  if (rd.size() != done.dimensions().size() + 1 || vd.size() != rd.size()) {
    return ffi::Error::InvalidArgument("fp4lab_progress: done (...), run (..., R), values (..., V)");
  }
  const int64_t n = static_cast<int64_t>(done.element_count());
  const int64_t r = rd[rd.size() - 1], v = vd[vd.size() - 1];
  if (static_cast<int64_t>(run.element_count()) != n * r ||
      static_cast<int64_t>(values.element_count()) != n * v) {
    return ffi::Error::InvalidArgument("fp4lab_progress: batch axes differ");
  }
  std::memset(out->typed_data(), 0, sizeof(int32_t) * out->element_count());
  Queue& q = queue();
  std::lock_guard<std::mutex> guard(q.lock);
  if (q.done.empty()) {
    q.run_words = r;
    q.value_words = v;
  } else if (q.run_words != r || q.value_words != v) {
    return ffi::Error::InvalidArgument("fp4lab_progress: two report layouts queued at once");
  }
  q.done.insert(q.done.end(), done.typed_data(), done.typed_data() + n);
  q.run.insert(q.run.end(), run.typed_data(), run.typed_data() + n * r);
  q.values.insert(q.values.end(), values.typed_data(), values.typed_data() + n * v);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(fp4lab_progress, Report,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

extern "C" {

// The layout of the queued reports: writes (count, R, V) into shape[3].
void fp4lab_progress_pending(int64_t* shape) {
  Queue& q = queue();
  std::lock_guard<std::mutex> guard(q.lock);
  shape[0] = static_cast<int64_t>(q.done.size());
  shape[1] = q.run_words;
  shape[2] = q.value_words;
}

// Moves up to `max` queued reports (oldest first) into the caller's arrays, of R and V words
// each as fp4lab_progress_pending said; returns how many it moved.
int64_t fp4lab_progress_take(int64_t max, int32_t* done, uint32_t* run, float* values) {
  Queue& q = queue();
  std::lock_guard<std::mutex> guard(q.lock);
  const int64_t n = std::min<int64_t>(max, static_cast<int64_t>(q.done.size()));
  const int64_t r = q.run_words, v = q.value_words;
  std::memcpy(done, q.done.data(), sizeof(int32_t) * n);
  std::memcpy(run, q.run.data(), sizeof(uint32_t) * n * r);
  std::memcpy(values, q.values.data(), sizeof(float) * n * v);
  q.done.erase(q.done.begin(), q.done.begin() + n);
  q.run.erase(q.run.begin(), q.run.begin() + n * r);
  q.values.erase(q.values.begin(), q.values.begin() + n * v);
  return n;
}

}  // extern "C"
