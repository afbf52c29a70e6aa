// The library's environment switch (JAXDNN_POISON_OUTPUTS=1, its one debug knob): each
// call site keeps env_switch's answer in a function-local static, so a variable is read once per
// process, at the first call that needs it.
#pragma once

#include <cstdlib>

namespace jaxdnn {

// The first character of environment variable `name`; '\0' when it is unset or empty.
inline char env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? '\0' : v[0];
}

}  // namespace jaxdnn
