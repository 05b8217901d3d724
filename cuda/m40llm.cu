// The library's one CUDA translation unit. Compiled whole (no relocatable
// device code), each architecture's image is complete on its own, which is
// what lets the driver JIT-compile the compute_52 PTX for GPUs newer than
// the SASS targets; the cc crate would otherwise compile several files with
// --device-c, whose PTX the runtime cannot load.
#include "matmul.cu"
#include "gemv.cu"
#include "mmq.cu"
#include "moe.cu"
#include "ops.cu"
#include "delta_net.cu"
#include "attention.cu"
#include "top.cu"
#include "device.cu"
#include "layout.cuh"  // the structs shared with the Rust side, checked
