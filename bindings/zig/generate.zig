//! generate (Zig): stream text from a GGUF model with libm40llm, through
//! `@cImport` of the C header.
//!
//!   zig build-exe -O ReleaseSafe generate.zig -I include -L target/release -lm40llm -lc
//!   ./generate MODEL "prompt" [max_tokens]
//!
//! Greedy decoding on the CPU; prints the prompt and its continuation.
//!
//! Build with -O ReleaseSafe (or -fllvm): Zig 0.15's own x86-64 code
//! generator, which Debug builds use, stores the 12-byte m40_model_params
//! that m40_model_default_params returns in two registers as 16 bytes,
//! overwriting the local beside it (here max_tokens, which became 0).
const c = @cImport({
    @cInclude("m40llm.h");
    @cInclude("stdio.h");
    @cInclude("stdlib.h");
    @cInclude("string.h");
});

fn onPiece(user_data: ?*anyopaque, piece: [*c]const u8, len: usize, token: c.m40_token) callconv(.c) bool {
    _ = user_data;
    _ = token;
    _ = c.fwrite(piece, 1, len, c.stdout);
    _ = c.fflush(c.stdout);
    return true;
}

fn fail(what: [*:0]const u8) c_int {
    _ = c.fprintf(c.stderr, "error: %s: %s\n", what, c.m40_last_error());
    return 1;
}

pub export fn main(argc: c_int, argv: [*][*:0]u8) c_int {
    if (argc < 3) {
        _ = c.fprintf(c.stderr, "usage: %s MODEL \"prompt\" [max_tokens]\n", argv[0]);
        return 2;
    }
    const requested: c_int = if (argc > 3) c.atoi(argv[3]) else 64;
    if (requested < 0) {
        _ = c.fprintf(c.stderr, "max_tokens must not be negative\n");
        return 2;
    }
    const max_tokens: u32 = @intCast(requested);

    var model_params = c.m40_model_default_params();
    model_params.device = -1;
    var model: ?*c.m40_model = null;
    if (c.m40_model_load(argv[1], &model_params, &model) != c.M40_OK) return fail("loading the model");
    defer _ = c.m40_free(model);

    var session: ?*c.m40_session = null;
    if (c.m40_session_new(model, null, &session) != c.M40_OK) return fail("creating a session");
    defer _ = c.m40_free(session);

    var sampler = c.m40_sampler_default_params();
    sampler.temperature = 0;
    const prompt = argv[2];
    _ = c.fputs(prompt, c.stdout);
    if (c.m40_generate(session, prompt, c.strlen(prompt), &sampler, max_tokens, onPiece, null) != c.M40_OK)
        return fail("generating");
    _ = c.fputs("\n", c.stdout);
    return 0;
}
