#pragma once
// Chat templates as models ship them (tokenizer_config.json "chat_template", GGUF
// "tokenizer.chat_template"), rendered the way transformers' apply_chat_template renders
// them: Jinja with trim_blocks and lstrip_blocks, loop controls, tojson as
// json.dumps(ensure_ascii=False), and the globals raise_exception and strftime_now.
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace kiln {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Throws kiln::Error with line and column when the template does not parse.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // From a parsed tokenizer_config.json: its "chat_template" (a string, or the list of
  // named templates, of which "default" is taken), "bos_token" and "eos_token" (strings or
  // AddedToken objects).
  static ChatTemplate from_tokenizer_config(const nlohmann::ordered_json& config);

  // messages: a JSON array of {"role", "content", ...} objects; every field is visible to
  // the template as is (tool_calls, name, reasoning_content...). extra: further template
  // variables (tools, documents, enable_thinking, reasoning_effort, ...). As in
  // transformers, `tools` and `documents` are none unless given. Pass ordered_json to keep
  // key order, which tojson prints. Throws kiln::Error on template errors, including the
  // template's own raise_exception (whose message is passed through unchanged).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // The clock behind strftime_now() (local time); the system clock unless replaced, e.g.
  // by tests that need a fixed date.
  void set_clock(std::function<std::chrono::system_clock::time_point()> clock) { clock_ = std::move(clock); }

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::unique_ptr<jinja::Template> template_;
  std::function<std::chrono::system_clock::time_point()> clock_;
};

}  // namespace kiln
