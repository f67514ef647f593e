/* `colibri gpuprobe`: the device's copy bandwidth through the driver API the CUDA backend uses
 * (dlopen'd libcuda.so.1, COLIBRI_LIBCUDA overrides), so scripts/gpu-check.sh can put a decode
 * rate next to what the memory can deliver (docs/cuda.md).
 *
 *   colibri gpuprobe [--mib N] [--iters N] [--json]
 *
 * Exit status: 0 measured, 1 no usable GPU (one line on stderr), 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cuda/cuda_backend.h"

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int gpuprobe_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri gpuprobe: %s\n", msg);
    fprintf(f,
            "usage: colibri gpuprobe [--mib N] [--iters N] [--json]\n"
            "  device-to-device copy bandwidth of GPU 0 (bytes read + bytes written per second)\n"
            "  --mib N     size of each of the two device buffers, MiB (default 512, 1..65536)\n"
            "  --iters N   timed copies (default 50, 1..10000)\n"
            "  --json      one JSON object instead of a line of text\n"
            "  (the global options are accepted and unused)\n");
    return 2;
}

static int gpuprobe_usage(const char *msg) { return gpuprobe_usage_to(stderr, msg); }

/* argv[0] is "gpuprobe" */
int cmd_gpuprobe(const cli_globals *g, int argc, char **argv) {
    long mib = 512, iters = 50;
    int json = 0, r;
    cli_globals globals = *g;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gpuprobe_usage_to(stdout, NULL);
            return 0;
        } else if ((r = cli_global(&globals, argc, argv, &i)) != 0) {
            if (r < 0) return gpuprobe_usage(NULL);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--mib")) {
            if (cli_long(v, 1, 65536, &mib)) return gpuprobe_usage("--mib must be 1..65536");
            i++;
        } else if (!strcmp(a, "--iters")) {
            if (cli_long(v, 1, 10000, &iters)) return gpuprobe_usage("--iters must be 1..10000");
            i++;
        } else {
            return gpuprobe_usage("unknown argument");
        }
    }
    colibri_cuda_bandwidth bw;
    char why[256] = "";
    if (colibri_cuda_copy_bandwidth((size_t)mib << 20, (int)iters, &bw, why, sizeof why)) {
        fprintf(stderr, "colibri gpuprobe: %s\n", why);
        return 1;
    }
    for (char *p = bw.device_name; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';
    if (json) {
        printf("{\"device\": \"%s\", \"sm\": %d, \"driver_version\": %d, \"integrated\": %s, "
               "\"bytes\": %zu, \"iters\": %d, \"seconds\": %.6f, \"copy_gbps\": %.3f, "
               "\"libcuda\": ",
               bw.device_name, bw.sm, bw.driver_version, bw.integrated ? "true" : "false",
               bw.bytes, bw.iters, bw.seconds, bw.gbps);
        cli_json_string(stdout, bw.libcuda, strlen(bw.libcuda));
        printf("}\n");
    } else {
        printf("%s (sm_%d, driver %d, %s): device copy %.1f GB/s (read + write, %d x %ld MiB)\n",
               bw.device_name, bw.sm, bw.driver_version, bw.libcuda, bw.gbps, bw.iters, mib);
    }
    return 0;
}
