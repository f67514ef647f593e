/* Kernel image table for a build without CUDA: no images, but the symbols exist so the CUDA
 * backend links identically in every build (it then reports "no kernel image for this GPU"). */
#include "cuda/kernel_images.h"

/* One unused entry because C forbids empty arrays; the count says there are none. */
const colibri_kernel_image colibri_kernel_images[1] = {{"none", 0, NULL, 0}};
const int colibri_kernel_image_count = 0;
