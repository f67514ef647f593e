/* Kernel images embedded in the binary by the kit's build (colibri_kit/build.py).
 *
 * For a CUDA target the build compiles runtime/kernels/colibri_kernels.cu once per profile SM to a
 * cubin (ptxas -arch=sm_XX) and once to PTX (compute_XX of the lowest SM, so a newer GPU can JIT
 * it; plus compute_XX of the lowest SM >= 80 when the lowest is below sm_80: the tensor-core
 * kernels' PTX, from which the cubins of SMs >= 80 are made), then links a generated table that
 * points at the raw bytes. colibri_cuda_pick_image takes the exact cubin, else the highest PTX
 * <= the device's SM. The bytes sit uncompressed and
 * 64-byte aligned in .rodata, so verify tools can find the cubin ELF headers by scanning the file.
 * Without CUDA the table is empty (runtime/embed/kernel_images_empty.c): the symbols always exist,
 * so the backend links the same way in every build and simply finds nothing to load. */
#ifndef COLIBRI_KERNEL_IMAGES_H
#define COLIBRI_KERNEL_IMAGES_H

#include <stddef.h>

typedef struct {
    const char *kind;          /* "cubin" or "ptx" */
    int sm;                    /* 87 for sm_87 (cubin) or compute_87 (ptx) */
    const unsigned char *data; /* cubin ELF bytes, or NUL-terminated PTX text */
    size_t size;               /* bytes in data (for PTX: including the trailing NUL) */
} colibri_kernel_image;

extern const colibri_kernel_image colibri_kernel_images[];
extern const int colibri_kernel_image_count;

#endif
