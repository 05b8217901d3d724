//! A host or a file abusing the library (issue 31): absurd parameters, paths
//! that are not files, files that ask for more memory than there is or carry
//! huge strings, and calls into a session from its own callback or from
//! another thread. Each must end in a clear status and message, and leave the
//! library working for the next call.

mod common;

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::gguf_writer::{vt, GgufWriter, Meta};
use common::tiny_model::{tiny_model, TINY};
use m40llm::error::{ErrorKind, MAX_ECHO_BYTES};
use m40llm::ffi::*;
use m40llm::gguf::GgufFile;
use m40llm::model::{LoadOptions, Model};

fn last_error() -> String {
    // SAFETY: m40_last_error returns the thread's live NUL-terminated message.
    unsafe { CStr::from_ptr(m40_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn c_path(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

fn cpu_params(n_threads: u32) -> m40_model_params {
    m40_model_params {
        device: -1,
        n_threads,
        ..m40_model_default_params()
    }
}

/// A tiny LLaMA model file, written once per test under its own name.
fn tiny_file(name: &str) -> PathBuf {
    let path = common::scratch_path(name);
    std::fs::write(&path, tiny_model("llama").build()).unwrap();
    path
}

fn load(path: &Path, params: &m40_model_params) -> Result<*mut m40_model, m40_status> {
    let mut model = std::ptr::null_mut();
    // SAFETY: valid path, params and out pointer.
    match unsafe { m40_model_load(c_path(path).as_ptr(), params, &mut model) } {
        m40_status::M40_OK => Ok(model),
        status => Err(status),
    }
}

fn new_session(model: *mut m40_model, n_ctx: u32) -> Result<*mut m40_session, m40_status> {
    let params = m40_session_params { n_ctx, n_batch: 0 };
    let mut session = std::ptr::null_mut();
    // SAFETY: valid params and out pointer; the model handle is checked.
    match unsafe { m40_session_new(model, &params, &mut session) } {
        m40_status::M40_OK => Ok(session),
        status => Err(status),
    }
}

fn decode(session: *mut m40_session, tokens: &[m40_token]) -> m40_status {
    // SAFETY: the slice is valid for its length.
    unsafe { m40_decode(session, tokens.as_ptr(), tokens.len()) }
}

fn free(handle: *mut impl Sized) -> m40_status {
    m40_free(handle.cast::<c_void>())
}

// ---------------------------------------------------------------------------
// n_threads
// ---------------------------------------------------------------------------

#[test]
fn n_threads_beyond_the_maximum_is_an_argument_error_and_later_loads_work() {
    let path = tiny_file("threads.gguf");
    for n_threads in [u32::MAX, 1025] {
        assert_eq!(
            load(&path, &cpu_params(n_threads)).err(),
            Some(m40_status::M40_ERR_INVALID_ARGUMENT),
            "n_threads {n_threads}"
        );
        let message = last_error();
        assert!(
            message.contains(&format!("n_threads {n_threads}")) && message.contains("1024"),
            "{message}"
        );
    }
    // The engine's own check, for Rust hosts that go around the C ABI.
    let options = LoadOptions {
        device: -1,
        n_threads: u32::MAX,
        use_mmap: false,
        vocab_only: false,
    };
    let Err(e) = Model::load(&path, options) else {
        panic!("4294967295 threads loaded")
    };
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");

    let model = load(&path, &cpu_params(3)).expect("3 threads load");
    let session = new_session(model, 32).unwrap();
    assert_eq!(decode(session, &[1, 5, 9]), m40_status::M40_OK);
    assert_eq!(free(session), m40_status::M40_OK);
    assert_eq!(free(model), m40_status::M40_OK);
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------
// A KV cache larger than memory
// ---------------------------------------------------------------------------

#[test]
fn a_kv_cache_larger_than_memory_is_out_of_memory_and_the_model_still_works() {
    let path = tiny_file("huge-kv.gguf");
    let model = load(&path, &cpu_params(2)).unwrap();
    // u32::MAX positions of 2 layers: hundreds of GB of f16 keys and values.
    assert_eq!(
        new_session(model, u32::MAX).err(),
        Some(m40_status::M40_ERR_OUT_OF_MEMORY)
    );
    let message = last_error();
    assert!(
        message.contains("4294967295 positions")
            && message.contains("needs")
            && message.contains("available"),
        "{message}"
    );
    let session = new_session(model, 64).expect("a small session after the failed one");
    assert_eq!(decode(session, &[1, 5, 9, 2]), m40_status::M40_OK);
    assert!(!m40_logits(session).is_null());
    assert_eq!(free(session), m40_status::M40_OK);
    assert_eq!(free(model), m40_status::M40_OK);
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------
// Paths that are not regular files
// ---------------------------------------------------------------------------

/// Runs `load` on another thread and waits at most 20 s for it. Should it
/// hang on the FIFO, a writer is opened to release it, and the test fails.
fn load_without_hanging<T: Send + 'static>(
    fifo: &Path,
    load: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || tx.send(load()).unwrap());
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(result) => {
            thread.join().unwrap();
            result
        }
        Err(_) => {
            // Non-blocking: succeeds only when the load waits in its open
            // (a reader is there), and never waits itself.
            use std::os::unix::fs::OpenOptionsExt;
            let _writer = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
            let _ = rx.recv_timeout(Duration::from_secs(5));
            panic!("loading the FIFO {} hung", fifo.display());
        }
    }
}

#[test]
fn a_fifo_is_an_io_error_at_once_not_a_hang() {
    let fifo = common::scratch_path("model.fifo");
    let _ = std::fs::remove_file(&fifo);
    // SAFETY: a valid NUL-terminated path.
    let made = unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) };
    assert_eq!(made, 0, "mkfifo: {}", std::io::Error::last_os_error());

    for use_mmap in [true, false] {
        let path = fifo.clone();
        let result = load_without_hanging(&fifo, move || {
            let options = LoadOptions {
                device: -1,
                n_threads: 1,
                use_mmap,
                vocab_only: false,
            };
            Model::load(&path, options).err()
        });
        let e = result.expect("a FIFO loaded");
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(
            e.message().contains("not a regular file (a FIFO)")
                && e.message().contains(&fifo.display().to_string()),
            "{e}"
        );
    }
    let path = fifo.clone();
    let (status, message) = load_without_hanging(&fifo, move || {
        (load(&path, &cpu_params(1)).err(), last_error())
    });
    assert_eq!(status, Some(m40_status::M40_ERR_IO), "{message}");
    assert!(message.contains("FIFO"), "{message}");
    std::fs::remove_file(&fifo).unwrap();
}

// ---------------------------------------------------------------------------
// Huge strings from the file
// ---------------------------------------------------------------------------

const MIB: usize = 1 << 20;

/// The message quotes at most MAX_ECHO_BYTES of the megabyte string `c`s,
/// says how long it was, and is short as a whole (a list of what is
/// supported may follow the quote).
fn assert_short(message: &str, c: char, must_contain: &str) {
    assert!(
        message.len() < 2048 && !message.contains(&c.to_string().repeat(MAX_ECHO_BYTES + 1)),
        "a message of {} bytes: {}…",
        message.len(),
        &message[..400]
    );
    assert!(message.contains(must_contain), "{message}");
    assert!(message.contains(&format!("… ({MIB} bytes)")), "{message}");
}

#[test]
fn a_megabyte_architecture_name_gives_a_short_message() {
    let long = "a".repeat(MIB);
    let mut w = tiny_model("llama");
    w.set_kv("general.architecture", Meta::str(&long));
    let path = common::scratch_path("huge-arch.gguf");
    std::fs::write(&path, w.build()).unwrap();
    assert_eq!(
        load(&path, &cpu_params(1)).err(),
        Some(m40_status::M40_ERR_UNSUPPORTED)
    );
    assert_short(&last_error(), 'a', "architecture 'aaa");

    // A vocab-only load takes any architecture; its chat template error
    // quotes the name.
    let options = LoadOptions {
        device: -1,
        n_threads: 1,
        use_mmap: false,
        vocab_only: true,
    };
    let model = Model::load(&path, options).unwrap();
    let Err(e) = model.chat_template() else {
        panic!("a chat template for architecture 'aaa…'")
    };
    assert_short(e.message(), 'a', "has no default one");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn other_megabyte_strings_from_the_file_give_short_messages() {
    let long = "k".repeat(MIB);
    type Edit<'a> = Box<dyn Fn(&mut GgufWriter) + 'a>;
    let cases: [(&str, Edit, &str); 4] = [
        (
            "tokenizer model",
            Box::new(|w| w.set_kv("tokenizer.ggml.model", Meta::str(&long))),
            "tokenizer model",
        ),
        (
            "pre-tokenizer",
            Box::new(|w| {
                w.set_kv("tokenizer.ggml.model", Meta::str("gpt2"));
                w.set_kv("tokenizer.ggml.merges", Meta::strings(&["t o"]));
                w.set_kv("tokenizer.ggml.pre", Meta::str(&long));
            }),
            "pre-tokenizer",
        ),
        (
            "a key with a malformed value",
            Box::new(|w| w.set_kv(&long, Meta::Raw(vt::BOOL, vec![2]))),
            "metadata key 'kkkk",
        ),
        (
            "a duplicate key",
            Box::new(|w| {
                w.kvs.push((long.clone(), Meta::U32(1)));
                w.kvs.push((long.clone(), Meta::U32(2)));
            }),
            "duplicate metadata key",
        ),
    ];
    for (what, edit, expected) in &cases {
        let mut w = tiny_model("llama");
        edit(&mut w);
        let Err(e) = GgufFile::from_bytes(&w.build()).and_then(|gguf| {
            Model::from_gguf(
                gguf,
                m40llm::backend::Device::Cpu { threads: 1 },
                LoadOptions {
                    device: -1,
                    n_threads: 1,
                    use_mmap: false,
                    vocab_only: false,
                },
            )
        }) else {
            panic!("{what}: loaded")
        };
        assert_short(e.message(), 'k', expected);
    }
}

// ---------------------------------------------------------------------------
// m40_status_str
// ---------------------------------------------------------------------------

#[test]
fn status_str_names_every_value_and_calls_the_others_unknown() {
    let text = |v: i32| {
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(m40_status_str(v)) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(text(0), "ok");
    assert_eq!(text(5), "out of memory");
    for v in [-1, 10, 1000, i32::MIN, i32::MAX] {
        assert_eq!(text(v), "unknown status", "{v}");
    }
}

// ---------------------------------------------------------------------------
// Calls into a session while m40_generate holds it
// ---------------------------------------------------------------------------

/// What the generate callback saw and did.
struct Probe {
    model: *mut m40_model,
    generating: *mut m40_session,
    other: *mut m40_session,
    /// (what, status, last error) of each call made from the callback.
    calls: Vec<(&'static str, m40_status, String)>,
    pieces: usize,
}

unsafe extern "C" fn probe_callback(
    user_data: *mut c_void,
    _piece: *const c_char,
    _len: usize,
    token: m40_token,
) -> bool {
    // SAFETY: user_data is the test's Probe, alive for the generate call.
    let probe = unsafe { &mut *user_data.cast::<Probe>() };
    probe.pieces += 1;
    if probe.pieces == 1 {
        let status = decode(probe.generating, &[token]);
        probe
            .calls
            .push(("decode the same session", status, last_error()));
        let n_past = m40_session_n_past(probe.generating);
        let status = if n_past == 0 {
            m40_status::M40_ERR_INVALID_ARGUMENT
        } else {
            m40_status::M40_OK
        };
        probe
            .calls
            .push(("n_past of the same session", status, last_error()));
        let status = decode(probe.other, &[token]);
        probe
            .calls
            .push(("decode another session", status, last_error()));
        let n_vocab = m40_model_n_vocab(probe.model);
        let status = if n_vocab == TINY.n_vocab as i32 {
            m40_status::M40_OK
        } else {
            m40_status::M40_ERR_INTERNAL
        };
        probe.calls.push(("query the model", status, last_error()));
    }
    probe.pieces < 3
}

/// Counts pieces and stops where `probe_callback` does.
unsafe extern "C" fn counting_callback(
    user_data: *mut c_void,
    _piece: *const c_char,
    _len: usize,
    _token: m40_token,
) -> bool {
    // SAFETY: user_data is the test's counter, alive for the generate call.
    let pieces = unsafe { &mut *user_data.cast::<usize>() };
    *pieces += 1;
    *pieces < 3
}

fn generate(
    session: *mut m40_session,
    prompt: &str,
    max_tokens: u32,
    on_piece: m40_piece_fn,
    user_data: *mut c_void,
) -> m40_status {
    let params = m40_sampler_params {
        temperature: 0.0,
        ..m40_sampler_default_params()
    };
    // SAFETY: the prompt is valid for its length; the callback takes this
    // user_data.
    unsafe {
        m40_generate(
            session,
            prompt.as_ptr().cast(),
            prompt.len(),
            &params,
            max_tokens,
            on_piece,
            user_data,
        )
    }
}

#[test]
fn a_callback_calling_into_its_own_session_gets_an_error_not_a_deadlock() {
    let path = tiny_file("reentrant.gguf");
    let model = load(&path, &cpu_params(2)).unwrap();
    let generating = new_session(model, 64).unwrap();
    let other = new_session(model, 64).unwrap();
    assert_eq!(decode(other, &[1]), m40_status::M40_OK);
    let mut probe = Probe {
        model,
        generating,
        other,
        calls: Vec::new(),
        pieces: 0,
    };
    let status = generate(
        generating,
        "tok3tok4",
        8,
        Some(probe_callback),
        (&mut probe as *mut Probe).cast(),
    );
    assert_eq!(status, m40_status::M40_OK, "{}", last_error());
    assert!(probe.pieces >= 1, "the callback never ran");
    let status_of = |what: &str| {
        probe
            .calls
            .iter()
            .find(|c| c.0 == what)
            .unwrap_or_else(|| panic!("{what} not tried"))
            .clone()
    };
    for what in ["decode the same session", "n_past of the same session"] {
        let (_, status, message) = status_of(what);
        assert_eq!(status, m40_status::M40_ERR_INVALID_ARGUMENT, "{what}");
        assert!(
            message.contains("in use by this thread") && message.contains("callback"),
            "{what}: {message}"
        );
    }
    for what in ["decode another session", "query the model"] {
        let (_, status, message) = status_of(what);
        assert_eq!(status, m40_status::M40_OK, "{what}: {message}");
    }
    // The refused calls changed nothing: the session is where a generation
    // without them stops, token for token.
    let reference = new_session(model, 64).unwrap();
    let mut pieces = 0usize;
    let status = generate(
        reference,
        "tok3tok4",
        8,
        Some(counting_callback),
        (&mut pieces as *mut usize).cast(),
    );
    assert_eq!(status, m40_status::M40_OK, "{}", last_error());
    assert_eq!(pieces, probe.pieces);
    assert_eq!(
        m40_session_n_past(generating),
        m40_session_n_past(reference)
    );
    let logits = |s| {
        // SAFETY: n_vocab floats, valid until the session's next decode.
        unsafe { std::slice::from_raw_parts(m40_logits(s), TINY.n_vocab as usize) }.to_vec()
    };
    assert_eq!(logits(generating), logits(reference));
    assert_eq!(decode(generating, &[7]), m40_status::M40_OK);
    for handle in [generating, other, reference] {
        assert_eq!(free(handle), m40_status::M40_OK);
    }
    assert_eq!(free(model), m40_status::M40_OK);
    std::fs::remove_file(&path).unwrap();
}

/// Holds the generation in its first callback until the test lets it go.
struct Gate {
    entered: mpsc::Sender<()>,
    release: Mutex<mpsc::Receiver<()>>,
    ran: AtomicBool,
}

unsafe extern "C" fn gate_callback(
    user_data: *mut c_void,
    _piece: *const c_char,
    _len: usize,
    _token: m40_token,
) -> bool {
    // SAFETY: user_data is the test's Gate, alive for the generate call.
    let gate = unsafe { &*user_data.cast::<Gate>() };
    if !gate.ran.swap(true, Ordering::SeqCst) {
        gate.entered.send(()).unwrap();
        gate.release.lock().unwrap().recv().unwrap();
    }
    true
}

#[test]
fn a_session_in_use_by_another_thread_is_refused_and_may_be_freed_safely() {
    let path = tiny_file("freed-in-use.gguf");
    let model = load(&path, &cpu_params(1)).unwrap();
    let session = new_session(model, 64).unwrap();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate = Arc::new(Gate {
        entered: entered_tx,
        release: Mutex::new(release_rx),
        ran: AtomicBool::new(false),
    });
    let address = session as usize;
    let worker = {
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            let status = generate(
                address as *mut m40_session,
                "tok3",
                4,
                Some(gate_callback),
                Arc::as_ptr(&gate) as *mut c_void,
            );
            (status, last_error())
        })
    };
    entered_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the generation reached its callback");

    // In use by the other thread: refused at once, not waited for.
    assert_eq!(decode(session, &[1]), m40_status::M40_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("in use by another thread"),
        "{}",
        last_error()
    );
    // Freed under the running call: the handle is gone at once...
    assert_eq!(free(session), m40_status::M40_OK);
    assert_eq!(decode(session, &[1]), m40_status::M40_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("not a live session handle"),
        "{}",
        last_error()
    );
    // ...and is not handed out again.
    let next = new_session(model, 64).unwrap();
    assert_ne!(next, session);
    assert_eq!(decode(session, &[1]), m40_status::M40_ERR_INVALID_ARGUMENT);

    // The running generation finishes on its own reference.
    release_tx.send(()).unwrap();
    let (status, message) = worker.join().unwrap();
    assert_eq!(status, m40_status::M40_OK, "{message}");
    assert_eq!(decode(next, &[1, 2]), m40_status::M40_OK);
    assert_eq!(free(next), m40_status::M40_OK);
    assert_eq!(free(model), m40_status::M40_OK);
    std::fs::remove_file(&path).unwrap();
}
