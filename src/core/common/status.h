// One success/failure vocabulary for the whole tree: Status (ok, or a code and a message)
// and Result<T> (a value, or a non-ok Status). Errors are values, never exceptions.
//
// Status is one pointer wide: ok costs nothing (no allocation); an error allocates its
// message once. Code says what kind of failure it is so that front ends can map it to a
// protocol status (HTTP, gRPC) without parsing text; the message is for people.
//
// Thread: values; no shared state.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvroute {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller's input is malformed (bad JSON, bad config value)
  kNotFound,          // the named thing does not exist (file, endpoint, plugin)
  kUnavailable,       // no endpoint can take it now; retrying later may succeed
  kResourceExhausted, // a bound was hit (body size, queue length)
  kFailedPrecondition,// valid input, wrong state (reload without a config file)
  kDeadlineExceeded,  // a timeout fired
  kInternal,          // a broken invariant we recovered from
};

std::string_view StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message)
      : rep_(code == StatusCode::kOk ? nullptr
                                     : std::make_shared<const Rep>(Rep{code, std::move(message)})) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // "" when ok.
  const std::string& message() const;
  // "OK", or "<CodeName>: <message>".
  std::string ToString() const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null: ok. Shared: copying an error is cheap.
};

// A value or an error. `Result<T> r = T{...}` or `= Status::X("...")` (never an ok Status).
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result from an ok Status has no value");
    if (status_.ok()) status_ = Status::Internal("Result built from an ok Status");
  }

  bool ok() const { return value_.has_value(); }
  // Ok when a value is held.
  const Status& status() const { return status_; }
  // Preconditions: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

inline const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

inline std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

inline std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code()));
  s += ": ";
  s += message();
  return s;
}

}  // namespace kvroute
