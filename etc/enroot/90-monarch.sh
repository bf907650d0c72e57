#!/bin/bash
# shellcheck disable=SC2015  # "A && B || off": off exits, whatever B returned
# Monarch's enroot hook: /usr/libexec/monarch/enroot-hook.sh, which enroot runs
# through the link /etc/enroot/hooks.d/90-monarch.sh.
#
# enroot runs every executable hooks.d/*.sh as the user, before the chroot,
# with the host environment (pyxis passes the job's, less LD_PRELOAD) and:
#   ENROOT_ROOTFS   the container's root file system
#   ENROOT_MOUNTS   an fstab file; its lines are mounted after the hooks, and
#                   so after 10-system.fstab's tmpfs on /tmp and /run
#   ENROOT_ENVIRON  the container's environment so far (the image's, the
#                   environ.d files, --env), NAME=value lines; the last line
#                   of a name wins
# A hook that exits non-zero aborts the container's start: this one always
# exits 0. For a Monarch job (MONARCH_DATASET and MONARCH_JOB_DIRS set) it
# binds the preload library and every tier's job directory at their host
# paths and passes Monarch's variables, when the image's C library can load
# the library (glibc 2.17 or later, or musl: there the library stays off by
# itself with one line). Anything else: no binds, none of Monarch's
# variables, and one line on stderr that says why. Outside a Monarch job it
# does nothing. It trusts no variable: each path is checked, and what it
# binds is what the user could bind with --container-mounts.
set -u

[ -n "${MONARCH_DATASET-}" ] && [ -n "${MONARCH_JOB_DIRS-}" ] || exit 0

readonly glibc_floor=(2 17)  # the oldest glibc the library loads into (issue 24)
library=${MONARCH_INTERPOSE_LIB-}
root=${ENROOT_ROOTFS-}

# The LD_PRELOAD the container has so far, without the library.
preload_without_library() {
  local value entry kept=""
  value=$(grep -a '^LD_PRELOAD=' "${ENROOT_ENVIRON}" 2>/dev/null | tail -n 1)
  value=${value#LD_PRELOAD=}
  local -a entries
  # Split on ':' and blanks as ld.so does; read, not word splitting, so that
  # no entry is matched as a pattern against the host's files.
  IFS=': ' read -r -a entries <<<"${value}"
  for entry in "${entries[@]}"; do
    [ "${entry}" = "${library}" ] || kept=${kept:+${kept}:}${entry}
  done
  printf '%s' "${kept}"
}

# Monarch off in this container: one line, and under pyxis (which copies the
# container's environment over the job's) an LD_PRELOAD without the library.
off() {
  printf 'monarch: off in this container: %s; reading from the PFS\n' "$1" >&2
  if [ -n "${ENROOT_ENVIRON-}" ] && [ -f "${ENROOT_ENVIRON}" ]; then
    printf 'LD_PRELOAD=%s\n' "$(preload_without_library)" >>"${ENROOT_ENVIRON}" 2>/dev/null
  fi
  exit 0
}

# An absolute path that an fstab line and a NAME=value line can carry.
plain_path() {
  [[ "$1" == /* && "$1" != *[[:space:][:cntrl:]]* ]]
}

# The host path of PATH as seen inside the root: each symbolic link is
# followed as the container will follow it (an absolute target starts again
# at the root, `..` stops at the root). Fails on a loop.
inside() {
  local rest=${1#/} out=${root} part target hops=0
  while [ -n "${rest}" ]; do
    part=${rest%%/*}
    if [ "${part}" = "${rest}" ]; then rest=""; else rest=${rest#*/}; fi
    case ${part} in
      "" | .) continue ;;
      ..) [ "${out}" = "${root}" ] || out=${out%/*}; continue ;;
    esac
    if [ -L "${out}/${part}" ]; then
      hops=$((hops + 1))
      [ "${hops}" -le 40 ] || return 1
      target=$(readlink -- "${out}/${part}") || return 1
      [[ "${target}" == /* ]] && out=${root}
      rest=${target#/}${rest:+/${rest}}
    else
      out=${out}/${part}
    fi
  done
  printf '%s\n' "${out}"
}

# Why the image's C library cannot load the library, or nothing when it can.
libc_problem() {
  local triplet musl dir file version
  case $(uname -m) in
    x86_64) triplet=x86_64-linux-gnu musl=x86_64 ;;
    aarch64) triplet=aarch64-linux-gnu musl=aarch64 ;;
    ppc64le) triplet=powerpc64le-linux-gnu musl=powerpc64le ;;
    *) echo "this architecture ($(uname -m)) is not one Monarch knows"; return ;;
  esac
  for dir in "lib/${triplet}" "usr/lib/${triplet}" lib64 usr/lib64 lib usr/lib; do
    file=$(inside "/${dir}/libc.so.6") && [ -f "${file}" ] || continue
    version=$(grep -a -o -m 1 -E 'release version [0-9]+\.[0-9]+' "${file}" | head -n 1)
    version=${version#release version }
    if [[ ! "${version}" =~ ^([0-9]+)\.([0-9]+)$ ]]; then
      echo "cannot tell the version of the image's glibc (/${dir}/libc.so.6)"
    elif ((BASH_REMATCH[1] < glibc_floor[0] ||
      (BASH_REMATCH[1] == glibc_floor[0] && BASH_REMATCH[2] < glibc_floor[1]))); then
      echo "the image's glibc ${version} is older than ${glibc_floor[0]}.${glibc_floor[1]}"
    fi
    return
  done
  for file in "/lib/ld-musl-${musl}.so.1" "/usr/lib/ld-musl-${musl}.so.1"; do
    file=$(inside "${file}") && [ -f "${file}" ] && return
  done
  echo "cannot tell the image's C library (no libc.so.6, no musl loader)"
}

[ -n "${ENROOT_MOUNTS-}" ] && [ -n "${ENROOT_ENVIRON-}" ] ||
  off "ENROOT_MOUNTS or ENROOT_ENVIRON is not set (not run by enroot?)"
[ -n "${root}" ] && [ -d "${root}" ] || off "ENROOT_ROOTFS is not a directory"
plain_path "${library}" && [ -f "${library}" ] && [ -r "${library}" ] ||
  off "MONARCH_INTERPOSE_LIB='${library}' is not a readable library"
for name in MONARCH_DATASET MONARCH_JOB_DIR MONARCH_JOB_DIRS MONARCH_LOG; do
  [[ "${!name-}" != *[[:cntrl:]]* ]] || off "${name} has a control character"
done
IFS=: read -r -a dirs <<<"${MONARCH_JOB_DIRS}"
[ "${#dirs[@]}" -gt 0 ] || off "MONARCH_JOB_DIRS names no job directory"
for dir in "${dirs[@]}"; do
  plain_path "${dir}" && [ -d "${dir}" ] ||
    off "MONARCH_JOB_DIRS names '${dir}', not a job directory"
done
problem=$(libc_problem)
[ -z "${problem}" ] || off "${problem}"

{
  printf '%s %s none x-create=file,bind,ro,nosuid,nodev,private\n' "${library}" "${library}"
  for dir in "${dirs[@]}"; do
    printf '%s %s none x-create=dir,rbind,rw,nosuid,nodev,private\n' "${dir}" "${dir}"
  done
} >>"${ENROOT_MOUNTS}" || off "cannot write ${ENROOT_MOUNTS}"
preload=$(preload_without_library)
{
  printf 'LD_PRELOAD=%s\n' "${preload:+${preload}:}${library}"
  printf 'MONARCH_DATASET=%s\n' "${MONARCH_DATASET}"
  printf 'MONARCH_JOB_DIR=%s\n' "${MONARCH_JOB_DIR-${dirs[0]}}"
  printf 'MONARCH_JOB_DIRS=%s\n' "${MONARCH_JOB_DIRS}"
  printf 'MONARCH_INTERPOSE_LIB=%s\n' "${library}"
  [ -z "${MONARCH_LOG-}" ] || printf 'MONARCH_LOG=%s\n' "${MONARCH_LOG}"
} >>"${ENROOT_ENVIRON}" || off "cannot write ${ENROOT_ENVIRON}"
exit 0
