// The emulation's own barriers (tests/gpu/test_kernels_emu.py::test_emulation_barriers): blocks of
// 64 fibers meeting at __syncthreads and __syncwarp in turn, then, when asked, a block where half
// the threads skip a __syncthreads, which a GPU would hang on and the emulation must report.
#include "cuda_emu.cpp"

int main(int argc, char **argv) {
    int after_block_bar = 0, in_order = 1;
    unsigned seen_block = 0;
    run_grid(3, 2, 64, [&] {
        if (blockIdx.y * gridDim.x + blockIdx.x != seen_block / 64) in_order = 0;
        __syncthreads();
        after_block_bar++;
        __syncwarp();
        seen_block++;
    });
    std::printf("blocks %d %d\n", after_block_bar, in_order);
    std::fflush(stdout);
    if (argc > 1 && std::strcmp(argv[1], "diverge") == 0)
        run_grid(1, 1, 64, [&] { if (threadIdx.x < 32) __syncthreads(); });
    std::printf("done\n");
    return 0;
}
