// Whether this build runs under a sanitizer (contrib/sanitize). Its
// allocator pads every block and keeps freed ones in quarantine, so a bound
// on a process's memory (VmHWM, RSS) is the normal build's to check; the
// sanitizer build still runs the code the bound is measured on.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
