//! The slice of the CUDA runtime API the backend uses (cudart is linked
//! statically), with every status turned into an [`Error`], and RAII owners
//! for streams and pinned host memory.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{RwLock, RwLockReadGuard};

use crate::error::{Error, ErrorKind, Result};

pub type Stream = *mut c_void;
type Event = *mut c_void;
type Graph = *mut c_void;
type GraphExec = *mut c_void;

const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_MEMORY_ALLOCATION: c_int = 2;
const CUDA_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const CUDA_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
const CUDA_STREAM_NON_BLOCKING: u32 = 1;
const CUDA_HOST_ALLOC_DEFAULT: u32 = 0;
const CUDA_EVENT_DISABLE_TIMING: u32 = 2;
/// Capture mode that lets other runtime calls (cudaMalloc from the memory
/// pool) run while a stream is being captured.
const CUDA_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
const CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const CUDA_DEV_ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CUDA_DEV_ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;

extern "C" {
    fn cudaGetDeviceCount(count: *mut c_int) -> c_int;
    fn cudaSetDevice(device: c_int) -> c_int;
    fn cudaGetDevice(device: *mut c_int) -> c_int;
    fn cudaDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> c_int;
    fn cudaDriverGetVersion(version: *mut c_int) -> c_int;
    fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int;
    fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int;
    fn cudaFree(ptr: *mut c_void) -> c_int;
    fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: u32) -> c_int;
    fn cudaFreeHost(ptr: *mut c_void) -> c_int;
    fn cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: c_int,
        stream: Stream,
    ) -> c_int;
    fn cudaMemsetAsync(ptr: *mut c_void, value: c_int, count: usize, stream: Stream) -> c_int;
    fn cudaStreamCreateWithFlags(stream: *mut Stream, flags: u32) -> c_int;
    fn cudaStreamDestroy(stream: Stream) -> c_int;
    fn cudaStreamSynchronize(stream: Stream) -> c_int;
    fn cudaEventCreateWithFlags(event: *mut Event, flags: u32) -> c_int;
    fn cudaEventRecord(event: Event, stream: Stream) -> c_int;
    fn cudaEventSynchronize(event: Event) -> c_int;
    fn cudaEventDestroy(event: Event) -> c_int;
    fn cudaEventElapsedTime(ms: *mut f32, start: Event, end: Event) -> c_int;
    fn cudaStreamBeginCapture(stream: Stream, mode: c_int) -> c_int;
    fn cudaStreamEndCapture(stream: Stream, graph: *mut Graph) -> c_int;
    fn cudaGraphInstantiateWithFlags(exec: *mut GraphExec, graph: Graph, flags: u64) -> c_int;
    fn cudaGraphLaunch(exec: GraphExec, stream: Stream) -> c_int;
    fn cudaGraphExecDestroy(exec: GraphExec) -> c_int;
    fn cudaGraphDestroy(graph: Graph) -> c_int;
    fn cudaGetErrorString(code: c_int) -> *const c_char;
    fn cudaGetLastError() -> c_int;
    fn m40_device_name(device: c_int, name: *mut c_char, capacity: usize) -> c_int;
}

/// The runtime's text for a status code.
fn error_text(code: c_int) -> String {
    // SAFETY: cudaGetErrorString returns a static NUL-terminated string for
    // any code, known or not.
    let text = unsafe { CStr::from_ptr(cudaGetErrorString(code)) };
    format!("{} (CUDA error {code})", text.to_string_lossy())
}

/// Turns a CUDA status into a result; `what` names the operation. An
/// allocation failure is OUT_OF_MEMORY, anything else BACKEND.
pub fn check(code: c_int, what: impl FnOnce() -> String) -> Result<()> {
    if code == CUDA_SUCCESS {
        return Ok(());
    }
    // A failed launch also leaves the code as the thread's last error; clear
    // it so that the next call does not report it again.
    // SAFETY: no arguments.
    unsafe { cudaGetLastError() };
    let kind = if code == CUDA_ERROR_MEMORY_ALLOCATION {
        ErrorKind::OutOfMemory
    } else {
        ErrorKind::Backend
    };
    Err(Error::new(
        kind,
        format!("{}: {}", what(), error_text(code)),
    ))
}

/// How many CUDA devices the driver offers; an error when there is no
/// usable driver.
pub fn device_count() -> Result<usize> {
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { cudaGetDeviceCount(&mut n) }, || {
        "no usable CUDA driver or device".to_string()
    })?;
    Ok(n.max(0) as usize)
}

/// Makes `device` current for the calling thread (each host thread that
/// talks to the device must do so first).
pub fn set_device(device: usize) -> Result<()> {
    // SAFETY: no pointers.
    check(unsafe { cudaSetDevice(device as c_int) }, || {
        format!("selecting CUDA device {device}")
    })
}

/// Makes `device` current for the calling thread unless it already is
/// (the cheap check keeps a per-operation call off the driver).
pub fn ensure_device(device: usize) -> Result<()> {
    let mut current = -1;
    // SAFETY: writes one int.
    let known = unsafe { cudaGetDevice(&mut current) } == CUDA_SUCCESS;
    if known && current == device as c_int {
        return Ok(());
    }
    set_device(device)
}

/// What `m40_model_describe` and the kernels' launch shapes need to know.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: usize,
    pub driver_version: i32,
    pub total_memory: usize,
}

pub fn device_info(device: usize) -> Result<DeviceInfo> {
    set_device(device)?;
    let attribute = |attr| -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        check(
            unsafe { cudaDeviceGetAttribute(&mut v, attr, device as c_int) },
            || format!("querying CUDA device {device}"),
        )?;
        Ok(v)
    };
    let mut name = [0 as c_char; 256];
    // SAFETY: m40_device_name writes at most `capacity` bytes, NUL-terminated.
    check(
        unsafe { m40_device_name(device as c_int, name.as_mut_ptr(), name.len()) },
        || format!("querying CUDA device {device}"),
    )?;
    // SAFETY: NUL-terminated by m40_device_name.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut driver_version = 0;
    // SAFETY: writes one int.
    check(unsafe { cudaDriverGetVersion(&mut driver_version) }, || {
        "querying the CUDA driver version".to_string()
    })?;
    let (_, total_memory) = memory_info()?;
    Ok(DeviceInfo {
        index: device,
        name,
        compute_capability: (
            attribute(CUDA_DEV_ATTR_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CUDA_DEV_ATTR_COMPUTE_CAPABILITY_MINOR)?,
        ),
        multiprocessors: attribute(CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT)?.max(1) as usize,
        driver_version,
        total_memory,
    })
}

/// (free, total) bytes of the current device.
pub fn memory_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes two sizes.
    check(unsafe { cudaMemGetInfo(&mut free, &mut total) }, || {
        "querying device memory".to_string()
    })?;
    Ok((free, total))
}

/// Raw device allocation; [`super::memory`] owns every pointer this returns.
pub fn malloc(bytes: usize) -> Result<*mut c_void> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    check(unsafe { cudaMalloc(&mut ptr, bytes.max(1)) }, || {
        format!(
            "allocating {} of device memory",
            super::memory::human(bytes)
        )
    })?;
    Ok(ptr)
}

/// Recordings in progress in this process, on any stream of any model. A
/// call that waits for the whole device (cudaFree, cudaFreeHost) is invalid
/// while a stream records and would end that recording, so such calls wait
/// for recordings to end. The recording thread itself must not make them
/// (see `DeviceAllocator::malloc`).
static RECORDINGS: RwLock<()> = RwLock::new(());

fn no_recording_in_progress() -> std::sync::RwLockWriteGuard<'static, ()> {
    RECORDINGS.write().unwrap_or_else(|e| e.into_inner())
}

/// # Safety
/// `ptr` came from [`malloc`] and is not used afterwards.
pub unsafe fn free(ptr: *mut c_void) {
    let _wait = no_recording_in_progress();
    // A failure here (a sticky error from an earlier fault) leaves nothing
    // to recover; the pointer is gone either way.
    unsafe { cudaFree(ptr) };
}

/// # Safety
/// `dst` is device memory of at least `bytes`; `src` stays valid and
/// unchanged until the stream has executed the copy (pageable host memory is
/// staged before this returns, so that holds for any host slice).
pub unsafe fn copy_to_device(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    check(
        unsafe { cudaMemcpyAsync(dst, src, bytes, CUDA_MEMCPY_HOST_TO_DEVICE, stream) },
        || format!("copying {} to the device", super::memory::human(bytes)),
    )
}

/// Enqueues a copy of device memory to host memory, without waiting (at
/// the link's speed where the host memory is pinned; pageable memory is
/// written through the driver's staging).
///
/// # Safety
/// `src` is device memory and `dst` host memory of at least `bytes` bytes
/// each; `dst` is not read or written until the stream has executed the
/// copy.
pub unsafe fn copy_to_host_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    check(
        unsafe { cudaMemcpyAsync(dst, src, bytes, CUDA_MEMCPY_DEVICE_TO_HOST, stream) },
        || "copying results to the host".to_string(),
    )
}

/// Copies device memory to the host and waits for it.
///
/// # Safety
/// `src` is device memory of at least `dst.len()` bytes.
pub unsafe fn copy_to_host(dst: &mut [u8], src: *const c_void, stream: Stream) -> Result<()> {
    // SAFETY: the caller's promise for src; dst is a live slice, read only
    // after the wait below.
    unsafe { copy_to_host_async(dst.as_mut_ptr().cast(), src, dst.len(), stream)? };
    check(unsafe { cudaStreamSynchronize(stream) }, || {
        "waiting for the device".to_string()
    })
}

/// # Safety
/// Both are device memory of at least `bytes`, not overlapping.
pub unsafe fn copy_on_device(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    check(
        unsafe { cudaMemcpyAsync(dst, src, bytes, CUDA_MEMCPY_DEVICE_TO_DEVICE, stream) },
        || "copying on the device".to_string(),
    )
}

/// # Safety
/// `ptr` is device memory of at least `bytes`.
pub unsafe fn zero(ptr: *mut c_void, bytes: usize, stream: Stream) -> Result<()> {
    check(unsafe { cudaMemsetAsync(ptr, 0, bytes, stream) }, || {
        "clearing device memory".to_string()
    })
}

pub fn synchronize(stream: &OwnedStream) -> Result<()> {
    // SAFETY: a live stream.
    check(unsafe { cudaStreamSynchronize(stream.raw()) }, || {
        "waiting for the device".to_string()
    })
}

/// A CUDA stream, destroyed on drop.
pub struct OwnedStream(Stream);

// SAFETY: a CUDA stream handle may be used from any host thread; the backend
// serializes its use behind a mutex.
unsafe impl Send for OwnedStream {}

impl OwnedStream {
    pub fn new() -> Result<OwnedStream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { cudaStreamCreateWithFlags(&mut stream, CUDA_STREAM_NON_BLOCKING) },
            || "creating a CUDA stream".to_string(),
        )?;
        Ok(OwnedStream(stream))
    }
    pub fn raw(&self) -> Stream {
        self.0
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: created by cudaStreamCreateWithFlags, destroyed once.
        unsafe { cudaStreamDestroy(self.0) };
    }
}

/// Page-locked host memory, the staging area of asynchronous uploads.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn new(len: usize) -> Result<PinnedBuffer> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(
            unsafe { cudaHostAlloc(&mut ptr, len, CUDA_HOST_ALLOC_DEFAULT) },
            || {
                format!(
                    "allocating {} of pinned host memory",
                    super::memory::human(len)
                )
            },
        )?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
        })
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated by cudaHostAlloc, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// The first `len` values as f32, so that results are copied out as
    /// whole slices rather than converted 4 bytes at a time.
    pub fn as_f32_slice(&self, len: usize) -> &[f32] {
        assert!(len <= self.len / 4);
        assert_eq!(self.ptr as usize % std::mem::align_of::<f32>(), 0);
        // SAFETY: `len * 4` bytes allocated by cudaHostAlloc and owned by
        // self (checked above), aligned for f32 (checked above; the runtime
        // aligns host allocations for any type); every bit pattern is an f32.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<f32>(), len) }
    }
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr.cast()
    }
    pub fn capacity(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _wait = no_recording_in_progress();
        // SAFETY: allocated by cudaHostAlloc, freed once.
        unsafe { cudaFreeHost(self.ptr.cast()) };
    }
}

/// A point in a stream's work that the host can wait for.
pub struct OwnedEvent(Event);

// SAFETY: as for streams.
unsafe impl Send for OwnedEvent {}
// SAFETY: its &self methods call the CUDA runtime, which may be called on
// one event from several threads at once (several host threads wait on the
// events of one read, `State::read_rows`).
unsafe impl Sync for OwnedEvent {}

impl OwnedEvent {
    pub fn new() -> Result<OwnedEvent> {
        Self::with_flags(CUDA_EVENT_DISABLE_TIMING)
    }

    /// An event that records a time stamp, for [`OwnedEvent::elapsed_since`].
    pub fn timed() -> Result<OwnedEvent> {
        Self::with_flags(0)
    }

    fn with_flags(flags: u32) -> Result<OwnedEvent> {
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { cudaEventCreateWithFlags(&mut event, flags) },
            || "creating a CUDA event".to_string(),
        )?;
        Ok(OwnedEvent(event))
    }

    /// Marks the work enqueued on `stream` so far.
    pub fn record(&self, stream: &OwnedStream) -> Result<()> {
        // SAFETY: a live event and stream.
        check(unsafe { cudaEventRecord(self.0, stream.raw()) }, || {
            "recording a CUDA event".to_string()
        })
    }

    /// Milliseconds between `start` and this event (both recorded and done).
    pub fn elapsed_since(&self, start: &OwnedEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: two live events; writes one float.
        check(
            unsafe { cudaEventElapsedTime(&mut ms, start.0, self.0) },
            || "timing device work".to_string(),
        )?;
        Ok(ms)
    }

    /// Waits until the recorded work is done (at once if none was recorded).
    pub fn wait(&self) -> Result<()> {
        // SAFETY: a live event.
        check(unsafe { cudaEventSynchronize(self.0) }, || {
            "waiting for the device".to_string()
        })
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        // SAFETY: created by cudaEventCreateWithFlags, destroyed once.
        unsafe { cudaEventDestroy(self.0) };
    }
}

/// A recording in progress: frees wait until it ends (see RECORDINGS).
pub struct Recording {
    _frees_wait: RwLockReadGuard<'static, ()>,
}

/// Starts recording the work enqueued on `stream` into a graph instead of
/// running it; [`end_capture`] ends the recording.
pub fn begin_capture(stream: &OwnedStream) -> Result<Recording> {
    let recording = Recording {
        _frees_wait: RECORDINGS.read().unwrap_or_else(|e| e.into_inner()),
    };
    // SAFETY: a live stream that is not being captured (the backend starts
    // one capture at a time and always ends it).
    check(
        unsafe { cudaStreamBeginCapture(stream.raw(), CUDA_STREAM_CAPTURE_MODE_RELAXED) },
        || "starting to capture a CUDA graph".to_string(),
    )?;
    Ok(recording)
}

/// Ends the recording [`begin_capture`] started on `stream` and makes the
/// recorded work launchable. An error when any recorded call failed.
pub fn end_capture(stream: &OwnedStream, recording: Recording) -> Result<OwnedGraph> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: a stream being captured; writes one handle (null when the
    // capture was invalidated).
    let ended = unsafe { cudaStreamEndCapture(stream.raw(), &mut graph) };
    drop(recording);
    let instantiated = check(ended, || "capturing a CUDA graph".to_string()).and_then(|()| {
        let mut exec = std::ptr::null_mut();
        // SAFETY: a complete graph; writes one handle.
        check(
            unsafe { cudaGraphInstantiateWithFlags(&mut exec, graph, 0) },
            || "instantiating a CUDA graph".to_string(),
        )?;
        Ok(OwnedGraph(exec))
    });
    if !graph.is_null() {
        // SAFETY: the recorded graph; the instantiated one does not need it.
        unsafe { cudaGraphDestroy(graph) };
    }
    instantiated
}

/// A recorded, launchable sequence of device work, destroyed on drop.
pub struct OwnedGraph(GraphExec);

// SAFETY: as for streams.
unsafe impl Send for OwnedGraph {}

impl OwnedGraph {
    /// Enqueues the recorded work on `stream`.
    pub fn launch(&self, stream: &OwnedStream) -> Result<()> {
        // SAFETY: a live graph and stream.
        check(unsafe { cudaGraphLaunch(self.0, stream.raw()) }, || {
            "launching a CUDA graph".to_string()
        })
    }
}

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        // SAFETY: instantiated by end_capture, destroyed once.
        unsafe { cudaGraphExecDestroy(self.0) };
    }
}
