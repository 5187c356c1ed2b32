// The lines of a text one at a time, without copying: split at '\n', a trailing '\r'
// removed (CRLF input). A final line without '\n' counts; the empty text has none.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvroute {

class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}

  // The next line into `line`; false after the last one.
  bool Next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    size_t eol = text_.find('\n', pos_);
    if (eol == std::string_view::npos) eol = text_.size();
    line = text_.substr(pos_, eol - pos_);
    pos_ = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return true;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace kvroute
