//! A sampler's candidates selected on the device ([`Backend::read_candidates`]):
//! each row's largest logits and a few others come back, not the whole
//! vocabulary (32 sessions of a 262,144-token vocabulary are 33.5 MB of
//! logits a step; their top 40 are 10 KB).
//!
//! [`Backend::read_candidates`]: crate::backend::Backend::read_candidates

use std::ffi::c_int;

use super::kernels::m40_top_logits;
use super::memory::Arena;
use super::runtime::check;
use super::staging::as_bytes;
use super::{dim, CudaBackend, DeviceBuffer};
use crate::backend::{CandidateRequest, Candidates};
use crate::error::{Error, Result};

impl CudaBackend {
    /// Row i of the logits rows (`row_len` each) at the start of `buffer`
    /// answers `requests[i]` in `out[i]`; untouched on failure.
    pub(super) fn candidates(
        &self,
        buffer: &DeviceBuffer,
        row_len: usize,
        requests: &[CandidateRequest],
        out: &mut [Candidates],
    ) -> Result<()> {
        assert!(requests.len() * row_len <= buffer.len() && out.len() == requests.len());
        let n = requests.len();
        // The kernel's inputs in one block: each row's want, the offsets of
        // each row's extra tokens, then the tokens.
        let mut wants: Vec<usize> = Vec::with_capacity(n);
        let mut extra_ids: Vec<c_int> = Vec::new();
        let mut offsets = vec![0 as c_int];
        for request in requests {
            let (want, extra) = match request {
                CandidateRequest::Best { want, extra } => ((*want).min(row_len), extra.as_slice()),
                CandidateRequest::Row => (0, &[][..]),
            };
            if extra.iter().any(|&t| t as usize >= row_len) {
                return Err(Error::internal("a candidate token outside the vocabulary"));
            }
            wants.push(want);
            extra_ids.extend(extra.iter().map(|&t| t as c_int));
            offsets.push(dim(extra_ids.len(), "candidate tokens")?);
        }
        let max_want = wants.iter().copied().max().unwrap_or(0);
        let mut input = wants
            .iter()
            .map(|&w| dim(w, "candidates wanted"))
            .collect::<Result<Vec<c_int>>>()?;
        input.extend_from_slice(&offsets);
        input.extend_from_slice(&extra_ids);
        let n_extra = extra_ids.len();
        let (ids_bytes, values_bytes) = (n * max_want * 4, n * max_want * 4);
        let out_bytes = ids_bytes + values_bytes + n_extra * 4;

        let mut state = self.lock();
        let st = &mut *state;
        let mut answers: Vec<Candidates> = vec![Candidates::default(); n];
        if out_bytes > 0 {
            st.arena.begin(
                &self.allocator,
                Arena::footprint(&[input.len() * 4, out_bytes]),
            )?;
            let device_input = st.arena.take::<c_int>(input.len());
            let device_out = st.arena.take::<u8>(out_bytes);
            // SAFETY: the arena pieces hold the input ints and the answers'
            // bytes; the kernel reads n want values, n + 1 offsets and the
            // extra ids after them, and writes within the three answer
            // arrays (max_want a row, n_extra values); the buffer holds the
            // n rows.
            let answer_bytes = unsafe {
                st.staging
                    .copy_to_device(device_input.cast(), as_bytes(&input), &st.stream)?;
                let out_ids = device_out.cast::<c_int>();
                let out_values = device_out.add(ids_bytes).cast::<f32>();
                let extra_values = device_out.add(ids_bytes + values_bytes).cast::<f32>();
                check(
                    m40_top_logits(
                        buffer.as_ptr(),
                        dim(row_len, "the vocabulary")?,
                        dim(n, "candidate rows")?,
                        device_input,
                        max_want as c_int,
                        out_ids,
                        out_values,
                        device_input.add(n),
                        device_input.add(2 * n + 1),
                        extra_values,
                        st.stream.raw(),
                    ),
                    || "candidate selection".to_string(),
                )?;
                st.read_bytes_to_pinned(device_out, out_bytes)?
            };
            let words = |from: usize, count: usize| {
                answer_bytes[from..from + 4 * count]
                    .chunks_exact(4)
                    .map(|b| [b[0], b[1], b[2], b[3]])
            };
            for (i, (request, answer)) in requests.iter().zip(&mut answers).enumerate() {
                if let CandidateRequest::Best { .. } = request {
                    let want = wants[i];
                    let ids = words(i * max_want * 4, want).map(u32::from_ne_bytes);
                    let values = words(ids_bytes + i * max_want * 4, want).map(f32::from_ne_bytes);
                    answer.best = ids.zip(values).collect();
                    let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
                    answer.values = words(ids_bytes + values_bytes + 4 * start, end - start)
                        .map(f32::from_ne_bytes)
                        .collect();
                }
            }
        }
        for (i, (request, answer)) in requests.iter().zip(&mut answers).enumerate() {
            if *request == CandidateRequest::Row {
                // SAFETY: row i lies within the buffer (asserted above).
                unsafe {
                    st.read_bytes_to_pinned(buffer.as_ptr().add(i * row_len).cast(), row_len * 4)?
                };
                answer.values = st.readback.as_f32_slice(row_len).to_vec();
            }
        }
        for (out, answer) in out.iter_mut().zip(answers) {
            *out = answer;
        }
        Ok(())
    }
}
