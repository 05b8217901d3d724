//! The cache of one sequence in host memory: for every attention layer, the
//! keys and values of each position, as wide as that layer's heads, stored
//! as f16 (half the memory of f32; attention converts them back as it
//! reads); for every linear-attention (Gated DeltaNet) layer, its recurrent
//! state in f32, whose size does not depend on the context.

use half::f16;

use crate::backend::DeltaNetShape;
use crate::error::{Error, Result};

/// What a cache keeps for one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// Keys and values of every position: `k_width` and `v_width` values a
    /// position (the layer's KV heads times their widths).
    Kv { k_width: usize, v_width: usize },
    /// A Gated DeltaNet layer's convolution and recurrent state.
    Recurrent(DeltaNetShape),
}

/// One Gated DeltaNet layer's state for one sequence.
pub struct RecurrentState {
    /// The last `conv_kernel − 1` convolution inputs, oldest first, each
    /// `channels` values.
    pub conv: Vec<f32>,
    /// Each value head's `head_dim × head_dim` state S, stored by value
    /// dimension: element j · head_dim + i is S[i][j] (key dim i).
    pub ssm: Vec<f32>,
    /// Tokens the state has taken in.
    pub tokens: usize,
}

pub struct KvCache {
    n_ctx: usize,
    /// Per layer: values of one position's keys and of its values (0 for a
    /// recurrent layer).
    widths: Vec<(usize, usize)>,
    /// Per layer: `n_ctx × k_width` keys and `n_ctx × v_width` values (empty
    /// for a recurrent layer).
    layers: Vec<(Vec<f16>, Vec<f16>)>,
    /// Per layer: the recurrent state of a linear-attention layer.
    recurrent: Vec<Option<RecurrentState>>,
}

impl KvCache {
    /// A cache of `n_ctx` positions for `n_layer` attention layers of the
    /// same widths. Fails with `OutOfMemory`, naming the bytes needed and
    /// available, when the machine (or the process's cgroup) has not that
    /// much memory free, or when the allocation fails. The memory comes
    /// zeroed from the allocator, not written: the OS provides its pages as
    /// they are first used.
    pub fn new(n_ctx: usize, n_layer: usize, k_width: usize, v_width: usize) -> Result<KvCache> {
        KvCache::with_layers(n_ctx, &vec![LayerState::Kv { k_width, v_width }; n_layer])
    }

    /// A cache of `n_ctx` positions for the attention layers of `layers`,
    /// each as wide as its own heads, and a zero state for its recurrent
    /// ones; fails as [`KvCache::new`].
    pub fn with_layers(n_ctx: usize, layers: &[LayerState]) -> Result<KvCache> {
        let n_layer = layers.len();
        let widths: Vec<(usize, usize)> = layers
            .iter()
            .map(|l| match *l {
                LayerState::Kv { k_width, v_width } => (k_width, v_width),
                LayerState::Recurrent(_) => (0, 0),
            })
            .collect();
        let too_big = || {
            Error::out_of_memory(format!(
                "a KV cache of {n_ctx} positions × {n_layer} layers does not fit in the address space"
            ))
        };
        let kv_values = widths.iter().try_fold(0usize, |sum, &(k, v)| {
            sum.checked_add(k.checked_add(v)?.checked_mul(n_ctx)?)
        });
        let recurrent_values = layers.iter().try_fold(0usize, |sum, l| match l {
            LayerState::Kv { .. } => Some(sum),
            LayerState::Recurrent(shape) => {
                let (conv, ssm) = shape.state_values();
                sum.checked_add(conv)?.checked_add(ssm)
            }
        });
        let total_bytes = kv_values
            .and_then(|n| n.checked_mul(std::mem::size_of::<f16>()))
            .zip(recurrent_values.and_then(|n| n.checked_mul(std::mem::size_of::<f32>())))
            .and_then(|(kv, recurrent)| kv.checked_add(recurrent))
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(too_big)?;
        if let Some(available) = memory::available() {
            if total_bytes as u64 > available.bytes {
                return Err(Error::out_of_memory(format!(
                    "a KV cache of {n_ctx} positions needs {} but {} {} available ({}); use a smaller n_ctx",
                    memory::human(total_bytes as u64),
                    memory::human(available.bytes),
                    if available.bytes == 1 { "is" } else { "are" },
                    available.source
                )));
            }
        }
        let mut kv = Vec::new();
        let mut recurrent = Vec::new();
        kv.try_reserve_exact(n_layer)
            .and_then(|_| recurrent.try_reserve_exact(n_layer))
            .map_err(|_| Error::out_of_memory("KV cache"))?;
        let no_room = || {
            Error::out_of_memory(format!(
                "cannot allocate a KV cache of {n_ctx} positions ({} in all)",
                memory::human(total_bytes as u64)
            ))
        };
        let zeroed = |n: usize| zeroed_f16(n).ok_or_else(no_room);
        for layer in layers {
            match *layer {
                LayerState::Kv { k_width, v_width } => {
                    kv.push((zeroed(n_ctx * k_width)?, zeroed(n_ctx * v_width)?));
                    recurrent.push(None);
                }
                LayerState::Recurrent(shape) => {
                    let (conv, ssm) = shape.state_values();
                    kv.push((Vec::new(), Vec::new()));
                    recurrent.push(Some(RecurrentState {
                        conv: zeroed_f32(conv).ok_or_else(no_room)?,
                        ssm: zeroed_f32(ssm).ok_or_else(no_room)?,
                        tokens: 0,
                    }));
                }
            }
        }
        Ok(KvCache {
            n_ctx,
            widths,
            layers: kv,
            recurrent,
        })
    }

    /// The recurrent state of `layer`, if it is a linear-attention layer.
    pub fn recurrent_mut(&mut self, layer: usize) -> Option<&mut RecurrentState> {
        self.recurrent[layer].as_mut()
    }

    /// Whether every recurrent layer's state has taken in exactly `tokens`
    /// tokens (true for a cache without recurrent layers): a failed step or
    /// a truncation leaves them elsewhere.
    pub fn recurrent_holds(&self, tokens: usize) -> bool {
        self.recurrent.iter().flatten().all(|r| r.tokens == tokens)
    }

    /// Every recurrent state back to that of no tokens.
    pub fn reset_recurrent(&mut self) {
        for r in self.recurrent.iter_mut().flatten() {
            r.conv.fill(0.0);
            r.ssm.fill(0.0);
            r.tokens = 0;
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Values of one position's keys (all KV heads) in `layer`.
    pub fn k_width(&self, layer: usize) -> usize {
        self.widths[layer].0
    }

    /// Values of one position's values (all KV heads) in `layer`.
    pub fn v_width(&self, layer: usize) -> usize {
        self.widths[layer].1
    }

    /// Stores the key and value of position `pos` in `layer`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (kw, vw) = self.widths[layer];
        let (keys, values) = &mut self.layers[layer];
        keys[pos * kw..(pos + 1) * kw].copy_from_slice_f32(k);
        values[pos * vw..(pos + 1) * vw].copy_from_slice_f32(v);
    }

    /// The keys of `layer` for `positions`, row after row.
    pub fn keys(&self, layer: usize, positions: std::ops::Range<usize>) -> &[f16] {
        let kw = self.widths[layer].0;
        &self.layers[layer].0[positions.start * kw..positions.end * kw]
    }

    pub fn values(&self, layer: usize, positions: std::ops::Range<usize>) -> &[f16] {
        let vw = self.widths[layer].1;
        &self.layers[layer].1[positions.start * vw..positions.end * vw]
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        let kv: usize = self
            .layers
            .iter()
            .map(|(k, v)| (k.len() + v.len()) * 2)
            .sum();
        let recurrent: usize = self
            .recurrent
            .iter()
            .flatten()
            .map(|r| (r.conv.len() + r.ssm.len()) * 4)
            .sum();
        kv + recurrent
    }
}

/// `n` zero values straight from the allocator's zeroed memory (calloc: for
/// a large block, fresh pages the OS zeroes as they are first touched), or
/// `None` when the allocation fails.
fn zeroed_f16(n: usize) -> Option<Vec<f16>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f16>(n).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f16>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `n` f16 values, and all-zero bits are the f16 value 0.0, so these are
    // `n` initialized elements and a capacity of `n`.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// `n` zero f32 values, or `None` when the allocation fails.
fn zeroed_f32(n: usize) -> Option<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, 0.0);
    Some(v)
}

/// Bytes of memory a new allocation can get now, where the OS says.
pub(crate) fn available_memory() -> Option<u64> {
    memory::available().map(|a| a.bytes)
}

/// How much memory a new allocation can get: the machine's and the
/// process's cgroup's, whichever is less.
mod memory {
    use std::path::{Path, PathBuf};

    pub struct Available {
        pub bytes: u64,
        /// Where the figure comes from, for the error message.
        pub source: String,
    }

    /// The memory available now, or `None` where the OS does not say.
    pub fn available() -> Option<Available> {
        let machine = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| meminfo_available(&text))
            .map(|bytes| Available {
                bytes,
                source: "MemAvailable in /proc/meminfo".to_string(),
            });
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| cgroup_available(&text, Path::new("/sys/fs/cgroup")));
        match (machine, cgroup) {
            (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
            (m, c) => m.or(c),
        }
    }

    /// `MemAvailable` of /proc/meminfo, in bytes.
    pub fn meminfo_available(meminfo: &str) -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    }

    /// The least room under a memory limit of the process's cgroup or its
    /// ancestors (a limit applies to everything under it), cgroup v2 or v1,
    /// given /proc/self/cgroup and where the hierarchies are mounted.
    pub fn cgroup_available(proc_cgroup: &str, mount: &Path) -> Option<Available> {
        let mut best: Option<Available> = None;
        for line in proc_cgroup.lines() {
            // "hierarchy-id:controllers:path"; v2 is "0::path".
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (root, limit_file, usage_file) = if id == "0" && controllers.is_empty() {
                (mount.to_path_buf(), "memory.max", "memory.current")
            } else if controllers.split(',').any(|c| c == "memory") {
                (
                    mount.join("memory"),
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                )
            } else {
                continue;
            };
            for dir in ancestors(&root, path) {
                let read = |file: &str| -> Option<u64> {
                    std::fs::read_to_string(dir.join(file))
                        .ok()?
                        .trim()
                        .parse()
                        .ok()
                };
                // "max" (v2) does not parse: no limit here.
                let (Some(limit), Some(usage)) = (read(limit_file), read(usage_file)) else {
                    continue;
                };
                // v1 writes "no limit" as a huge page-rounded number.
                if limit >= 1 << 60 {
                    continue;
                }
                let bytes = limit.saturating_sub(usage);
                if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                    best = Some(Available {
                        bytes,
                        source: format!(
                            "the cgroup limit {} ({}) less its usage {}",
                            human(limit),
                            dir.join(limit_file).display(),
                            human(usage)
                        ),
                    });
                }
            }
        }
        best
    }

    /// The cgroup's directory and those above it, up to the mount point.
    /// Inside a cgroup namespace, or where the cgroup's own directory is not
    /// visible, the path may not exist: the mount point itself is then the
    /// process's cgroup.
    fn ancestors(root: &Path, path: &str) -> Vec<PathBuf> {
        let mut dirs = vec![root.to_path_buf()];
        let mut dir = root.to_path_buf();
        for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir = dir.join(part);
            dirs.push(dir.clone());
        }
        dirs
    }

    /// Bytes as "1.5 GiB", "12 MiB", "512 bytes".
    pub fn human(bytes: u64) -> String {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if bytes < 1024 {
            return format!("{bytes} bytes");
        }
        let mut value = bytes as f64;
        let mut unit = "";
        for u in UNITS {
            if value < 1024.0 {
                break;
            }
            value /= 1024.0;
            unit = u;
        }
        format!("{value:.1} {unit} ({bytes} bytes)")
    }
}

trait FromF32 {
    fn copy_from_slice_f32(&mut self, src: &[f32]);
}

impl FromF32 for [f16] {
    fn copy_from_slice_f32(&mut self, src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        self.convert_from_f32_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::memory::*;
    use super::*;

    #[test]
    fn the_cache_starts_zeroed() {
        let kv = KvCache::new(8, 2, 4, 6).unwrap();
        for layer in 0..2 {
            assert!(kv.keys(layer, 0..8).iter().all(|&x| x == f16::ZERO));
            assert!(kv.values(layer, 0..8).iter().all(|&x| x == f16::ZERO));
        }
        assert_eq!(kv.size_bytes(), 2 * 8 * 10 * 2);
    }

    #[test]
    fn each_attention_layer_is_as_wide_as_its_own_heads() {
        // Gemma 4's shape in small: a sliding-window layer of 2 KV heads of
        // 4 values, a full-attention layer of 1 KV head of 8, then a
        // recurrent layer, which holds no keys or values.
        let net = crate::backend::DeltaNetShape {
            conv_kernel: 2,
            head_dim: 2,
            n_k_heads: 1,
            n_v_heads: 1,
        };
        let layers = [
            LayerState::Kv {
                k_width: 8,
                v_width: 8,
            },
            LayerState::Kv {
                k_width: 8,
                v_width: 6,
            },
            LayerState::Recurrent(net),
        ];
        let mut kv = KvCache::with_layers(5, &layers).unwrap();
        assert_eq!((kv.k_width(1), kv.v_width(1)), (8, 6));
        assert_eq!((kv.k_width(2), kv.v_width(2)), (0, 0));
        let (conv, ssm) = net.state_values();
        assert_eq!(
            kv.size_bytes(),
            5 * (8 + 8) * 2 + 5 * (8 + 6) * 2 + (conv + ssm) * 4
        );
        let (k, v): (Vec<f32>, Vec<f32>) = ((0..8).map(|i| i as f32).collect(), vec![0.5; 6]);
        kv.store(1, 4, &k, &v);
        assert_eq!(kv.keys(1, 4..5).len(), 8);
        assert_eq!(kv.keys(1, 4..5)[7], f16::from_f32(7.0));
        assert_eq!(kv.values(1, 3..5).len(), 12);
        assert!(kv.keys(0, 0..5).iter().all(|&x| x == f16::ZERO));
    }

    #[test]
    fn a_cache_larger_than_memory_is_out_of_memory_naming_both_sizes() {
        let err = KvCache::new(1 << 62, 64, 1024, 1024)
            .err()
            .expect("too big");
        assert_eq!(err.kind(), crate::error::ErrorKind::OutOfMemory);
        assert!(err.message().contains("does not fit"), "{err}");
        let err = KvCache::new(1 << 24, 64, 1024, 1024)
            .err()
            .expect("too big");
        assert_eq!(err.kind(), crate::error::ErrorKind::OutOfMemory);
        assert!(
            err.message().contains("needs 4.0 TiB") && err.message().contains("available"),
            "{err}"
        );
    }

    #[test]
    fn meminfo_gives_mem_available_in_bytes() {
        let text = "MemTotal:       24683656 kB\nMemFree:  1 kB\nMemAvailable:   23240312 kB\n";
        assert_eq!(meminfo_available(text), Some(23240312 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn cgroup_limits_of_v1_and_v2_and_their_ancestors_are_read() {
        let mount = std::env::temp_dir().join(format!("m40llm-cgroup-{}", std::process::id()));
        let write = |dir: &std::path::Path, files: &[(&str, &str)]| {
            std::fs::create_dir_all(dir).unwrap();
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
            }
        };
        // v2: the parent's limit is the tighter one.
        write(
            &mount,
            &[("memory.max", "max\n"), ("memory.current", "1\n")],
        );
        write(
            &mount.join("a"),
            &[("memory.max", "3000\n"), ("memory.current", "1000\n")],
        );
        write(
            &mount.join("a/b"),
            &[("memory.max", "max\n"), ("memory.current", "500\n")],
        );
        let got = cgroup_available("0::/a/b\n", &mount).unwrap();
        assert_eq!(got.bytes, 2000);
        assert!(got.source.contains("memory.max"), "{}", got.source);
        // v1: "no limit" is a huge number; the memory controller's line counts.
        let v1 = mount.join("memory");
        write(
            &v1,
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.usage_in_bytes", "5\n"),
            ],
        );
        write(
            &v1.join("c"),
            &[
                ("memory.limit_in_bytes", "1000\n"),
                ("memory.usage_in_bytes", "900\n"),
            ],
        );
        let got = cgroup_available("4:memory:/c\n2:cpu:/x\n", &mount).unwrap();
        assert_eq!(got.bytes, 100);
        assert!(cgroup_available("4:memory:/\n", &mount).is_none());
        std::fs::remove_dir_all(&mount).unwrap();
    }
}
