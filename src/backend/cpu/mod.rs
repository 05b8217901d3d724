//! The CPU backend: a pool of worker threads and the matrix products over the
//! quantized formats of [`crate::quant`].

mod matmul;
mod pool;

pub use matmul::{matmul, WeightMatrix};
pub use pool::ThreadPool;
