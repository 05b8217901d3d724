//! The C ABI (`docs/c-api.md`). This is the only module that sees raw
//! pointers: each exported function checks its arguments through the helpers
//! in [`args`], runs its body under [`status::guard`] (which catches panics and
//! records the error message), and calls the safe engine.
//!
//! The names here are the C names, so that cbindgen writes the header the
//! contract specifies.
//!
//! cbindgen writes the functions in the order it reads them: the modules in
//! the order declared here, then each module's items in source order. That
//! order is the header's: a program's lifecycle, from the library's version
//! to releasing handles. Each section's first function opens its doc comment
//! with a "==== N. Title ====" line (cbindgen writes no free comments), and
//! the header's preamble (cbindgen.toml) lists the sections.
#![allow(non_camel_case_types)]

mod args;
mod handles;
mod status;

// The header's sections, in order (blank lines keep rustfmt from sorting).
// 1. The library: versions and errors.
mod library;

// 2. Models: parameters and loading; 3. Models: queries.
mod model;

// 4. The tokenizer.
mod tokenizer;

// 5. Sessions; 6. Decoding; 7. Sampling; 8. Generation.
mod session;

// 9. Chat templates.
mod chat;

// 10. Releasing handles.
mod release;

pub use chat::*;
pub use library::*;
pub use model::*;
pub use release::*;
pub use session::*;
pub use status::m40_status;
pub use tokenizer::*;
