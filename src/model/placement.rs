//! Which layers each device holds when a model is split over several
//! devices (GPUs, the CPU, or one of them given twice).
//!
//! A split is a list of devices in order, each holding a contiguous run of
//! layers: the first device with layers also embeds the tokens, the last
//! one also holds the output norm and projection. A forward pass runs the
//! devices one after another, and only the activations of the rows in
//! flight cross from one to the next.

use std::ops::Range;

use crate::backend::Device;
use crate::error::{Error, Result};

/// Most devices a split may name.
pub const MAX_DEVICES: usize = 64;

/// Device memory a GPU keeps free beyond its layers when the split is
/// chosen from free memory: activations, KV caches and scratch.
const GPU_RESERVE: u64 = 1 << 30;

/// One entry of a split as a host gives it: a device index (-1: the CPU)
/// and its share of the layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceShare {
    pub device: i32,
    /// Relative share of the layers; 0 on every entry: chosen from each
    /// device's free memory.
    pub share: f32,
}

/// A device and the layers it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub device: Device,
    pub layers: Range<usize>,
}

/// The shares' validity, before any device is touched.
pub fn check_shares(shares: &[DeviceShare]) -> Result<()> {
    check_share_values(shares.len(), shares.iter().map(|s| s.share))
}

fn check_share_values(n: usize, mut shares: impl Iterator<Item = f32>) -> Result<()> {
    if n == 0 || n > MAX_DEVICES {
        return Err(Error::invalid_argument(format!(
            "a split names {n} devices; it takes 1 to {MAX_DEVICES}"
        )));
    }
    if let Some((i, s)) = shares
        .by_ref()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && *s >= 0.0))
    {
        return Err(Error::invalid_argument(format!(
            "device entry {i} has share {s}; shares are finite and at least 0"
        )));
    }
    Ok(())
}

/// The placement of `layer_bytes.len()` layers (each holding that many
/// bytes of weights) over `devices`, in order. With explicit shares, device
/// i holds the layers between the rounded cumulative fractions of the
/// shares before it and through it. Without (every share 0): the GPUs take
/// layers in proportion to their free memory, each at most what fits in it
/// beside `GPU_RESERVE` and `edge_bytes` (the embedding and output), and the
/// CPU entries share the rest equally; with no CPU entry, every device's
/// share is its free memory. Devices left without layers are dropped.
pub fn place(
    devices: &[(Device, f32)],
    layer_bytes: &[u64],
    edge_bytes: u64,
    free_memory: impl Fn(&Device) -> Result<u64>,
) -> Result<Vec<Placement>> {
    check_share_values(devices.len(), devices.iter().map(|(_, s)| *s))?;
    let n_layer = layer_bytes.len();
    let explicit = devices.iter().any(|(_, s)| *s > 0.0);
    let counts = if explicit {
        counts_by_share(
            &devices
                .iter()
                .map(|(_, s)| f64::from(*s))
                .collect::<Vec<_>>(),
            n_layer,
        )
    } else {
        // A device named more than once shares its free memory among them.
        let free = devices
            .iter()
            .map(|(d, _)| {
                let times = devices.iter().filter(|(other, _)| other == d).count() as u64;
                Ok(free_memory(d)? / times)
            })
            .collect::<Result<Vec<u64>>>()?;
        let is_cpu = |d: &Device| matches!(d, Device::Cpu { .. });
        if devices.iter().all(|(d, _)| !is_cpu(d)) || devices.iter().all(|(d, _)| is_cpu(d)) {
            counts_by_share(&free.iter().map(|&f| f as f64).collect::<Vec<_>>(), n_layer)
        } else {
            gpus_first(devices, &free, layer_bytes, edge_bytes)
        }
    };
    let mut placements = Vec::new();
    let mut start = 0;
    for ((device, _), count) in devices.iter().zip(counts) {
        if count > 0 {
            placements.push(Placement {
                device: device.clone(),
                layers: start..start + count,
            });
        }
        start += count;
    }
    if start != n_layer {
        return Err(Error::internal(format!(
            "a split placed {start} of {n_layer} layers"
        )));
    }
    if placements.is_empty() {
        // A model with no layers still embeds and projects on one device.
        placements.push(Placement {
            device: devices[0].0.clone(),
            layers: 0..0,
        });
    }
    Ok(placements)
}

/// Layers per device: device i ends at round(n · (s_0 + … + s_i) / Σ s).
fn counts_by_share(shares: &[f64], n_layer: usize) -> Vec<usize> {
    let total: f64 = shares.iter().sum();
    if total <= 0.0 {
        // No free memory anywhere to go by: equal shares.
        return counts_by_share(&vec![1.0; shares.len()], n_layer);
    }
    let mut cumulative = 0.0;
    let mut previous_end = 0;
    shares
        .iter()
        .map(|s| {
            cumulative += s;
            let end = ((n_layer as f64 * cumulative / total).round() as usize).min(n_layer);
            let count = end.saturating_sub(previous_end);
            previous_end = previous_end.max(end);
            count
        })
        .collect()
}

/// GPUs take their part of the layers by free memory up to what fits,
/// the CPU entries the rest. Which layers a GPU gets depends on the counts
/// of the entries before it, so the fit is reckoned with the largest layer.
fn gpus_first(
    devices: &[(Device, f32)],
    free: &[u64],
    layer_bytes: &[u64],
    edge_bytes: u64,
) -> Vec<usize> {
    let n_layer = layer_bytes.len();
    let is_gpu: Vec<bool> = devices
        .iter()
        .map(|(d, _)| matches!(d, Device::Cuda { .. }))
        .collect();
    let gpu_free: Vec<f64> = free
        .iter()
        .zip(&is_gpu)
        .map(|(&f, &g)| if g { f as f64 } else { 0.0 })
        .collect();
    let mut counts = counts_by_share(&gpu_free, n_layer);
    let largest = layer_bytes.iter().copied().max().unwrap_or(0).max(1);
    for (i, count) in counts.iter_mut().enumerate() {
        if is_gpu[i] {
            let room = free[i].saturating_sub(GPU_RESERVE + edge_bytes);
            *count = (*count).min((room / largest) as usize);
        }
    }
    let rest = n_layer - counts.iter().sum::<usize>();
    let cpus: Vec<usize> = (0..devices.len()).filter(|&i| !is_gpu[i]).collect();
    for (k, &i) in cpus.iter().enumerate() {
        counts[i] = rest / cpus.len() + usize::from(k < rest % cpus.len());
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: Device = Device::Cpu { threads: 1 };
    const GPU0: Device = Device::Cuda { index: 0 };
    const GPU1: Device = Device::Cuda { index: 1 };

    fn ranges(p: &[Placement]) -> Vec<Range<usize>> {
        p.iter().map(|p| p.layers.clone()).collect()
    }

    #[test]
    fn shares_divide_the_layers_in_order() {
        let no_memory = |_: &Device| -> Result<u64> { panic!("explicit shares need no query") };
        let p = place(&[(CPU, 1.0), (CPU, 1.0)], &[1; 30], 0, no_memory).unwrap();
        assert_eq!(ranges(&p), [0..15, 15..30]);
        let p = place(&[(GPU0, 3.0), (CPU, 1.0)], &[1; 30], 0, no_memory).unwrap();
        assert_eq!(ranges(&p), [0..23, 23..30]);
        assert_eq!(p[0].device, GPU0);
        let p = place(
            &[(CPU, 1.0), (GPU0, 1.0), (GPU1, 1.0)],
            &[1; 4],
            0,
            no_memory,
        )
        .unwrap();
        assert_eq!(ranges(&p), [0..1, 1..3, 3..4]);
    }

    #[test]
    fn a_device_without_layers_is_dropped() {
        let no_memory = |_: &Device| -> Result<u64> { unreachable!() };
        let p = place(
            &[(GPU0, 1.0), (CPU, 0.0), (GPU1, 1.0)],
            &[1; 6],
            0,
            no_memory,
        )
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].device.clone(), p[1].device.clone()), (GPU0, GPU1));
        assert_eq!(ranges(&p), [0..3, 3..6]);
        // More devices than layers.
        let p = place(&vec![(CPU, 1.0); 5], &[1; 2], 0, no_memory).unwrap();
        assert_eq!(ranges(&p).iter().map(|r| r.len()).sum::<usize>(), 2);
    }

    #[test]
    fn without_shares_gpus_take_what_fits_and_the_cpu_the_rest() {
        let gib = 1u64 << 30;
        // 10 layers of 1 GiB; GPU 0 has 6 GiB free, GPU 1 4 GiB: 5 + 3
        // layers fit beside the reserve, the CPU takes 2.
        let free = |d: &Device| {
            Ok(match d {
                Device::Cuda { index: 0 } => 6 * gib,
                Device::Cuda { .. } => 4 * gib,
                Device::Cpu { .. } => 100 * gib,
            })
        };
        let p = place(&[(GPU0, 0.0), (GPU1, 0.0), (CPU, 0.0)], &[gib; 10], 0, free).unwrap();
        assert_eq!(ranges(&p), [0..5, 5..8, 8..10]);
        // Without a CPU entry: by free memory, 6 : 4.
        let p = place(&[(GPU0, 0.0), (GPU1, 0.0)], &[gib; 10], 0, free).unwrap();
        assert_eq!(ranges(&p), [0..6, 6..10]);
        // The CPU first: the GPU still takes what fits, the last layers.
        let p = place(&[(CPU, 0.0), (GPU1, 0.0)], &[gib; 10], 0, free).unwrap();
        assert_eq!(ranges(&p), [0..7, 7..10]);
        // One GPU named twice: its 6 GiB are shared, 3 GiB each, 2 layers
        // each beside the reserve.
        let p = place(&[(GPU0, 0.0), (GPU0, 0.0), (CPU, 0.0)], &[gib; 10], 0, free).unwrap();
        assert_eq!(ranges(&p), [0..2, 2..4, 4..10]);
        // Everything fits: the CPU is left out.
        let p = place(&[(GPU0, 0.0), (CPU, 0.0)], &[1; 10], 0, free).unwrap();
        assert_eq!((p.len(), p[0].layers.clone()), (1, 0..10));
    }

    #[test]
    fn bad_shares_are_refused_by_place_too() {
        let no_memory = |_: &Device| -> Result<u64> { unreachable!() };
        assert!(place(&[(CPU, f32::NAN), (CPU, 1.0)], &[1; 4], 0, no_memory).is_err());
        assert!(place(&[(CPU, f32::INFINITY)], &[1; 4], 0, no_memory).is_err());
    }

    #[test]
    fn bad_shares_are_refused() {
        let share = |share| DeviceShare { device: -1, share };
        assert!(check_shares(&[]).is_err());
        assert!(check_shares(&[share(f32::NAN)]).is_err());
        assert!(check_shares(&[share(-1.0)]).is_err());
        assert!(check_shares(&[share(f32::INFINITY)]).is_err());
        assert!(check_shares(&vec![share(1.0); MAX_DEVICES + 1]).is_err());
        assert!(check_shares(&[share(0.0), share(2.0)]).is_ok());
    }
}
