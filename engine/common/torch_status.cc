#include "engine/common/torch_status.h"

#include <c10/util/Exception.h>

#include <new>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status StatusFromCurrentException(absl::string_view context) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(context, ": out of memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const StatusException& e) {
    return absl::Status(e.status().code(), absl::StrCat(context, ": ", e.status().message()));
  } catch (const ResourceExhaustedException& e) {
    return absl::ResourceExhaustedError(absl::StrCat(context, ": ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(context, ": out of host memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(context, ": unknown exception"));
  }
}

}  // namespace ferry
