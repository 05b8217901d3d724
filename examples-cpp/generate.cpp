// generate (C++): stream text from a GGUF model through include/m40llm.hpp.
//
//   generate-cpp MODEL "prompt" [max_tokens] [temperature]
//
// Prints the prompt and its continuation as it is generated, then on stderr
// the number of prompt and generated tokens. Errors print the library's status
// and message and exit with 1.
#include "m40llm.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char **argv) {
    if (argc < 3) {
        std::cerr << "usage: " << argv[0] << " MODEL \"prompt\" [max_tokens] [temperature]\n";
        return 2;
    }
    const std::string prompt = argv[2];
    const unsigned max_tokens = argc > 3 ? static_cast<unsigned>(std::strtoul(argv[3], nullptr, 10)) : 64;
    m40_sampler_params sampler = m40::default_sampler();
    if (argc > 4) sampler.temperature = std::strtof(argv[4], nullptr);
    try {
        m40_model_params params = m40_model_default_params();
        params.device = -1;  // the CPU: the example runs anywhere
        const m40::Model model(argv[1], params);
        m40::Session session(model);
        std::cout << prompt << std::flush;
        unsigned pieces = 0;
        session.generate(prompt, max_tokens, sampler, [&](std::string_view piece) {
            std::cout << piece << std::flush;
            pieces++;
            return true;
        });
        std::cout << "\n";
        std::cerr << "prompt: " << model.tokenize(prompt).size() << " tokens | generated: " << pieces
                  << " pieces\n";
    } catch (const m40::Error &e) {
        std::cerr << "error (" << m40_status_str(e.status()) << "): " << e.what() << "\n";
        return 1;
    }
    return 0;
}
