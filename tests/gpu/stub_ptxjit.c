/* A stand-in libnvidia-ptxjitcompiler.so.1 (the PTX JIT compiler library NVIDIA's driver opens by
 * soname; cuda-compat ships its own beside its libcuda.so.1) for the compat-driver tests: built
 * with -DSTUB_DRIVER_VERSION=N and -Wl,-soname,libnvidia-ptxjitcompiler.so.1, it tells the
 * stand-in libcuda (tests/gpu/stub_libcuda.c -DSTUB_JIT_CHECK) which driver it belongs to. */
#ifndef STUB_DRIVER_VERSION
#define STUB_DRIVER_VERSION 12060
#endif
int stub_ptxjit_version(void) { return STUB_DRIVER_VERSION; }
