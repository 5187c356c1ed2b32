// A self-contained HTML page for reports (the demo's report.html): sections of
// paragraphs, preformatted text, tables and inline SVG, with its CSS inline and no
// external resource (no script, font, stylesheet or image by URL), so the file can be
// mailed or opened offline. Pure: strings in, a string out.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvroute::report {

// `s` with & < > " ' replaced by their entities: safe as HTML/XML text and inside a
// double- or single-quoted attribute.
std::string HtmlEscape(std::string_view s);

struct HtmlBlock {
  enum class Kind {
    kParagraph,  // `text`, escaped, in <p>
    kPre,        // `text`, escaped, in <pre> (fixed-width tables, a diagnosis)
    kTable,      // `header` and `rows`, every cell escaped; cells after the first are
                 // right-aligned (numbers)
    kSvg,        // `text` is a complete SVG document from our own writers, inlined as is
  };
  Kind kind = Kind::kParagraph;
  std::string text;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

struct HtmlSection {
  std::string id;     // the anchor (letters, digits, '-'); the table of contents links it
  std::string title;  // escaped, in <h2>
  std::vector<HtmlBlock> blocks;
};

// The whole page: <!DOCTYPE html>, `title` in <title> and <h1>, `subtitle` (may be
// empty) under it, a table of contents, then each section in order. Trailing newline.
std::string HtmlPage(std::string_view title, std::string_view subtitle,
                     const std::vector<HtmlSection>& sections);

}  // namespace kvroute::report
