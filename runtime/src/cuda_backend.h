/* Boundary between the runtime core and the CUDA backend (runtime/src/cuda_backend.c).
 *
 * The core never includes CUDA headers: the backend loads libcuda.so.1 with dlopen at run time and
 * launches kernels from the cubins/PTX embedded in the binary (see kernel_images.h). When the GPU
 * cannot be used, colibri_cuda_open fails with a one-line reason and the core runs on the CPU
 * (backend "auto") or reports the error (backend "cuda"). */
#ifndef COLIBRI_CUDA_BACKEND_H
#define COLIBRI_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct colibri_model; /* runtime/src/model.h: the validated, mmapped model */

typedef struct colibri_cuda colibri_cuda;

typedef struct {
    char device_name[128];
    int sm;               /* compute capability as major*10+minor, e.g. 87 */
    int driver_version;   /* cuDriverGetVersion(), e.g. 12060 */
    char image[8];        /* "cubin" or "ptx": what was loaded */
    int integrated;       /* 1 when the GPU shares DRAM with the CPU (Jetson) */
    size_t device_bytes;  /* bytes the backend holds resident (arena + weights) */
} colibri_cuda_info;

/* Bring up the GPU for this model: 0 on success; otherwise non-zero with `why` set to one line. */
int colibri_cuda_open(colibri_cuda **out, const struct colibri_model *model, int stream_count,
                      char *why, size_t why_len);

/* n tokens from KV position pos; logits (n x vocab floats) to host memory. 0 on success. */
int colibri_cuda_forward(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *logits,
                         char *why, size_t why_len);

void colibri_cuda_reset(colibri_cuda *cu);
void colibri_cuda_get_info(const colibri_cuda *cu, colibri_cuda_info *info);
void colibri_cuda_close(colibri_cuda *cu);

#endif
