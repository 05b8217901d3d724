//! The C ABI (`docs/c-api.md`). This is the only module that sees raw
//! pointers: each exported function checks its arguments through the helpers
//! in [`args`], runs its body under [`status::guard`] (which catches panics and
//! records the error message), and calls the safe engine.
//!
//! The names here are the C names, so that cbindgen writes the header the
//! contract specifies.
#![allow(non_camel_case_types)]

mod args;
mod chat;
mod handles;
mod library;
mod model;
mod session;
mod status;
mod tokenizer;

pub use chat::*;
pub use library::*;
pub use model::*;
pub use session::*;
pub use status::m40_status;
pub use tokenizer::*;
