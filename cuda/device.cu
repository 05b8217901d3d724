// Device queries the CUDA runtime answers only through structs whose layout
// changes between toolkit versions, so they are read here rather than in Rust.
#include "common.cuh"

// The device's name, for m40_model_describe.
M40_EXPORT cudaError_t m40_device_name(int device, char *name, size_t capacity) {
    cudaDeviceProp prop;
    cudaError_t status = cudaGetDeviceProperties(&prop, device);
    if (status != cudaSuccess) return status;
    size_t i = 0;
    for (; i + 1 < capacity && prop.name[i]; i++) name[i] = prop.name[i];
    if (capacity) name[i] = 0;
    return cudaSuccess;
}
