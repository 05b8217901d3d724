//! Compute backends. The CPU backend runs everywhere; the device index a host
//! passes picks one.

pub mod cpu;

use crate::error::{Error, Result};

/// The device a model runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu { threads: usize },
}

/// The device index `m40_model_default_params` proposes: the first CUDA device
/// when one is usable, else the CPU (-1). This build has no CUDA backend.
pub fn default_device_index() -> i32 {
    -1
}

impl Device {
    /// The device for a host's `device` index and `n_threads` (0: one per core).
    pub fn select(index: i32, n_threads: u32) -> Result<Device> {
        match index {
            -1 => {
                let threads = match n_threads {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n as usize,
                };
                Ok(Device::Cpu { threads })
            }
            i if i >= 0 => Err(Error::unsupported(format!(
                "device {i} requested, but this build of libm40llm has no CUDA backend; use device -1 (CPU)"
            ))),
            i => Err(Error::invalid_argument(format!(
                "device index {i} is invalid (-1 for the CPU, 0..N-1 for a CUDA device)"
            ))),
        }
    }

    /// The backend's short name, as `m40_model_describe` reports it.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Device::Cpu { .. } => "cpu",
        }
    }

    /// A human-readable device name (the CPU's model name where the OS tells it).
    pub fn name(&self) -> String {
        match self {
            Device::Cpu { .. } => {
                cpu_model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string())
            }
        }
    }
}

fn cpu_model_name() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo.lines().find_map(|line| {
        line.strip_prefix("model name")?
            .split_once(':')
            .map(|(_, v)| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn cpu_is_device_minus_one_and_zero_threads_means_all_cores() {
        let Device::Cpu { threads } = Device::select(-1, 0).unwrap();
        assert!(threads >= 1);
        assert_eq!(Device::select(-1, 3).unwrap(), Device::Cpu { threads: 3 });
    }

    #[test]
    fn bad_device_indices_are_rejected_with_reasons() {
        assert_eq!(
            Device::select(-2, 1).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let err = Device::select(0, 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.message().contains("no CUDA backend"), "{err}");
    }
}
