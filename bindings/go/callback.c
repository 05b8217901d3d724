// The C side of Session.Generate's streaming callback: m40_generate calls
// this function pointer, which calls the exported Go function.
#include "_cgo_export.h"

bool m40go_on_piece(void *user_data, const char *piece, size_t len, m40_token token) {
    return m40goPiece(user_data, (char *)piece, len, token);
}
