#include "simkit/report/html.h"

#include <fmt/format.h>

namespace kvroute::report {
namespace {

// Plain system fonts and no colours beyond greys: the charts carry the colour.
constexpr std::string_view kCss =
    "body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;"
    "max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}"
    "h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:2em;"
    "border-bottom:1px solid #ddd;padding-bottom:.2em}"
    ".sub{color:#666;margin-top:0}"
    "pre{background:#f6f8fa;padding:.8em 1em;overflow-x:auto;font-size:.85em;"
    "line-height:1.3}"
    "table{border-collapse:collapse;font-size:.9em;margin:.5em 0}"
    "th,td{border:1px solid #ddd;padding:.3em .6em}th{background:#f6f8fa}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "nav ul{padding-left:1.2em}svg{max-width:100%;height:auto;display:block;"
    "margin:.5em 0}";

// An anchor made only of safe characters, so it needs no escaping in href or id.
std::string AnchorOf(std::string_view id) {
  std::string out;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    out.push_back(ok ? c : '-');
  }
  return out.empty() ? "section" : out;
}

void AppendBlock(std::string& out, const HtmlBlock& b) {
  switch (b.kind) {
    case HtmlBlock::Kind::kParagraph:
      out += "<p>" + HtmlEscape(b.text) + "</p>\n";
      break;
    case HtmlBlock::Kind::kPre:
      out += "<pre>" + HtmlEscape(b.text) + "</pre>\n";
      break;
    case HtmlBlock::Kind::kTable: {
      out += "<table>\n<tr>";
      for (const std::string& h : b.header) out += "<th>" + HtmlEscape(h) + "</th>";
      out += "</tr>\n";
      for (const std::vector<std::string>& row : b.rows) {
        out += "<tr>";
        for (size_t i = 0; i < row.size(); ++i) {
          out += i == 0 ? "<td>" : "<td class=\"n\">";
          out += HtmlEscape(row[i]) + "</td>";
        }
        out += "</tr>\n";
      }
      out += "</table>\n";
      break;
    }
    case HtmlBlock::Kind::kSvg:
      out += "<figure>" + b.text + "</figure>\n";
      break;
  }
}

}  // namespace

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string HtmlPage(std::string_view title, std::string_view subtitle,
                     const std::vector<HtmlSection>& sections) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>" + HtmlEscape(title) + "</title>\n<style>";
  out += kCss;
  out += "</style>\n</head>\n<body>\n<h1>" + HtmlEscape(title) + "</h1>\n";
  if (!subtitle.empty()) out += "<p class=\"sub\">" + HtmlEscape(subtitle) + "</p>\n";
  if (!sections.empty()) {
    out += "<nav><ul>\n";
    for (const HtmlSection& s : sections) {
      out += fmt::format("<li><a href=\"#{}\">{}</a></li>\n", AnchorOf(s.id), HtmlEscape(s.title));
    }
    out += "</ul></nav>\n";
  }
  for (const HtmlSection& s : sections) {
    out += fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n", AnchorOf(s.id), HtmlEscape(s.title));
    for (const HtmlBlock& b : s.blocks) AppendBlock(out, b);
    out += "</section>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace kvroute::report
