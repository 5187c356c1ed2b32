// The bytes of one simdjson On-Demand value as they are written in the document, for a
// front end that passes a field on verbatim (a chat request's template fields, P/D's
// kv_transfer_params).
#pragma once

#include <simdjson.h>

#include <string_view>

namespace kvroute::api {

// `v`'s bytes (an array or object whole, or a scalar token), without the whitespace that
// may follow them in the document.
simdjson::error_code RawJson(simdjson::ondemand::value v, std::string_view& out);

}  // namespace kvroute::api
