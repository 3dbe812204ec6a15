#pragma once
// The process's heap policy for normcheck's executables (reference/README.md, "The heap").
//
// glibc hands an allocation of more than 128 KiB to the kernel (mmap) and gives freed memory
// at the top of the heap back when more than 128 KiB is free; its dynamic thresholds then move
// by the sizes seen. The judge and the diagnosis allocate and free arrays of a case's size for
// every output and every dialect, so each came back as fresh pages: the kernel's page faults
// and the zero-filling of those pages were about half of `check`'s and the diagnosis's CPU time
// on the ci tier (measured; README). keep_freed_memory() makes glibc serve allocations up to
// 1 GiB from the heap and keep up to 1 GiB of freed memory for reuse. The peak resident set is
// that of the largest case as before (memory the process frees is reused, not added);
// between cases the process keeps that peak instead of returning it.
//
// A process-wide setting: the executables call it first thing in main(). The libraries never
// call it (a host process, such as a Python interpreter that imports the module, keeps its
// own policy). Without glibc it does nothing. Returns whether the policy was set.
namespace normcheck::ref {

bool keep_freed_memory() noexcept;

}  // namespace normcheck::ref
