// A minimal error type for the kernel layer: empty message means success. Handlers turn a
// failed Status into an ffi::Error; the message names the kernel and what went wrong.
#pragma once

#include <string>
#include <utility>

namespace jaxdnn {

struct Status {
  std::string message;
  bool ok() const { return message.empty(); }
  static Status Ok() { return {}; }
  static Status Error(std::string m) { return Status{std::move(m)}; }
};

// Whether an algorithm can run a problem, and why not.
struct Support {
  bool ok;
  std::string reason;  // empty when ok
  static Support Yes() { return {true, {}}; }
  static Support No(std::string why) { return {false, std::move(why)}; }
};

}  // namespace jaxdnn
