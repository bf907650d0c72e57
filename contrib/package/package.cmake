# The packages (CPack), .deb and .rpm, split the way sites install Monarch:
#   monarch               the node part (component "node"): monarch-stager,
#                         monarch-run, monarch-report, the interposition library,
#                         /etc/monarch/monarch.conf (a configuration file the
#                         package manager never overwrites), their man pages.
#   monarch-slurm-plugin  the SPANK plugin and its commented plugstack.conf.d
#                         drop-in (component "slurm"). A SPANK plugin is built
#                         for one Slurm release: its version carries that
#                         release (0.1.0-1+slurm22.05) and it depends on it.
# CPack gives every package of one run the same version, so the two come from
# two runs (per-package.cmake picks the package):
#   cmake -S . -B build -DCMAKE_INSTALL_PREFIX=/usr
#   cmake --build build --target packages          -> build/packages/
# The programs find each other at the paths compiled in, so packages are made
# only from a build configured for /usr.
set(MONARCH_PACKAGER "Monarch for Slurm maintainers <maintainers@users.noreply.a-seed-6cbb020c.example>"
  CACHE STRING "the packages' Maintainer/Packager: name <address> of who builds them")
set(MONARCH_PACKAGE_RELEASE "1" CACHE STRING
  "the packages' release (Debian revision): raise it to rebuild the same version")

# The Slurm release spank.h belongs to, as major.minor ("22.05"), and the next
# one ("22.06"), for the plugin's version and dependency.
set(MONARCH_SLURM_RELEASE "")
if(SLURM_INCLUDE_DIR AND EXISTS "${SLURM_INCLUDE_DIR}/slurm/slurm_version.h")
  file(STRINGS "${SLURM_INCLUDE_DIR}/slurm/slurm_version.h" number
    REGEX "^#define SLURM_VERSION_NUMBER ")
  string(REGEX REPLACE ".* 0x([0-9a-fA-F]+).*" "\\1" number "${number}")
  math(EXPR number "0x${number}")
  math(EXPR major "(${number} >> 16) & 255")
  math(EXPR minor "(${number} >> 8) & 255")
  math(EXPR next "${minor} + 1")
  foreach(m minor next)
    if(${m} LESS 10)
      set(${m} "0${${m}}")
    endif()
  endforeach()
  set(MONARCH_SLURM_RELEASE "${major}.${minor}")
  set(MONARCH_SLURM_NEXT_RELEASE "${major}.${next}")
endif()

set(CPACK_PACKAGE_NAME monarch)
set(CPACK_PACKAGE_VENDOR "Monarch for Slurm")
set(CPACK_PACKAGE_CONTACT "${MONARCH_PACKAGER}")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_RELOCATABLE OFF)  # the programs find each other at compiled-in paths
set(CPACK_GENERATOR DEB RPM)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL node slurm)
set(CPACK_PROJECT_CONFIG_FILE "${CMAKE_CURRENT_LIST_DIR}/per-package.cmake")
# Read by per-package.cmake at cpack time.
set(CPACK_MONARCH_RELEASE "${MONARCH_PACKAGE_RELEASE}")
set(CPACK_MONARCH_SLURM_RELEASE "${MONARCH_SLURM_RELEASE}")
set(CPACK_MONARCH_SLURM_NEXT_RELEASE "${MONARCH_SLURM_NEXT_RELEASE}")
set(CPACK_MONARCH_BINARY_DIR "${PROJECT_BINARY_DIR}")

# The configuration files, which the package manager never overwrites once an
# admin edited them (Debian conffiles, RPM %config(noreplace)). The enroot
# hook is not one: it is code, a link in /etc to the program.
set(node_config "${MONARCH_SYSCONF}/monarch.conf")
set(slurm_config "${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm/plugstack.conf.d/monarch.conf")
file(WRITE "${PROJECT_BINARY_DIR}/package/node/conffiles" "${node_config}\n")
file(WRITE "${PROJECT_BINARY_DIR}/package/slurm/conffiles" "${slurm_config}\n")
set(CPACK_DEBIAN_NODE_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/package/node/conffiles")
set(CPACK_DEBIAN_SLURM_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/package/slurm/conffiles")
set(CPACK_RPM_NODE_USER_FILELIST "%config(noreplace) ${node_config}")
set(CPACK_RPM_SLURM_USER_FILELIST "%config(noreplace) ${slurm_config}")
# Directories other packages own (Slurm's, enroot's, the man sections) stay theirs.
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
  "${CMAKE_INSTALL_FULL_SYSCONFDIR}/enroot" "${CMAKE_INSTALL_FULL_SYSCONFDIR}/enroot/hooks.d"
  "${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm"
  "${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm/plugstack.conf.d"
  "${CMAKE_INSTALL_FULL_MANDIR}" "${CMAKE_INSTALL_FULL_MANDIR}/man1"
  "${CMAKE_INSTALL_FULL_MANDIR}/man5" "${CMAKE_INSTALL_FULL_MANDIR}/man8")

set(CPACK_DEBIAN_NODE_PACKAGE_NAME monarch)
set(CPACK_DEBIAN_SLURM_PACKAGE_NAME monarch-slurm-plugin)
set(CPACK_RPM_NODE_PACKAGE_NAME monarch)
set(CPACK_RPM_SLURM_PACKAGE_NAME monarch-slurm-plugin)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
# Depends from the shared libraries the binaries link (dpkg-shlibdeps; RPM
# finds them itself): libucx0 comes with the stager's use of UCX (peers.h).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_RPM_PACKAGE_LICENSE "LicenseRef-unstated")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Daemons")
set(CPACK_RPM_SPEC_MORE_DEFINE "%define packager ${MONARCH_PACKAGER}")  # the Packager tag

set(CPACK_COMPONENT_NODE_DESCRIPTION "Node-local staging of deep-learning datasets
Monarch stages a dataset from the parallel file system to node-local tiers
(SSD, memory) and serves every process of a job from the fastest tier that
holds it, through an LD_PRELOAD library: no change to the training script.
This package holds the node part: monarch-stager (one per job and node),
the interposition library, monarch-run (Monarch without Slurm),
monarch-report (what Monarch did for a job) and /etc/monarch/monarch.conf.")
set(CPACK_COMPONENT_SLURM_DESCRIPTION "Slurm SPANK plugin of Monarch (sbatch --monarch-dataset)
The SPANK plugin that adds --monarch-dataset, --monarch-report and
--monarch-verbose to sbatch, salloc and srun, starts Monarch's stager for the
job on every node and cleans up at job end. Built for one Slurm release (in
this package's version). Installing it enables nothing: the plugstack.conf
line in /etc/slurm/plugstack.conf.d/monarch.conf is commented out.")
# Both summaries, for RPM (the first line of each description above).
set(CPACK_RPM_NODE_PACKAGE_SUMMARY "Node-local staging of deep-learning datasets")
set(CPACK_RPM_SLURM_PACKAGE_SUMMARY "Slurm SPANK plugin of Monarch (sbatch --monarch-dataset)")

# Each package's /usr/share/doc/<package>/: copyright, and the changelog
# (changelog.in, in Debian's format, whose first entry is this version)
# rendered as changelog.Debian.gz; RPMs get it as %changelog too. Only for
# the packages: `cmake --install` leaves them out (EXCLUDE_FROM_ALL).
function(monarch_package_docs component package version)
  set(dir "${PROJECT_BINARY_DIR}/package/${component}")
  set(PACKAGE "${package}")
  set(VERSION "${version}")
  set(MAINTAINER "${MONARCH_PACKAGER}")
  configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/changelog.in" "${dir}/changelog.Debian" @ONLY)
  add_custom_command(OUTPUT "${dir}/changelog.Debian.gz"
    COMMAND sh -c "gzip -9n -c \"$1\" >\"$2\"" sh "${dir}/changelog.Debian"
      "${dir}/changelog.Debian.gz"
    DEPENDS "${dir}/changelog.Debian" VERBATIM)
  add_custom_target(changelog-${component} ALL DEPENDS "${dir}/changelog.Debian.gz")
  install(FILES "${dir}/changelog.Debian.gz" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/copyright"
    DESTINATION "${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}" COMPONENT ${component} EXCLUDE_FROM_ALL)
  # RPM's %changelog: "* Mon Nov 23 2026 NAME <MAIL> - VERSION" then "- " items.
  file(STRINGS "${dir}/changelog.Debian" lines)
  set(rpm "")
  set(items "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[^ ]+ \\(([^)]+)\\)")
      set(entry_version "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^  \\* (.*)")
      string(APPEND items "- ${CMAKE_MATCH_1}\n")
    elseif(line MATCHES "^    (.*)")
      string(APPEND items "  ${CMAKE_MATCH_1}\n")
    elseif(line MATCHES "^ -- (.*)  ([A-Z][a-z][a-z]), ([0-9]+) ([A-Z][a-z][a-z]) ([0-9]+)")
      string(REPLACE "+" "." entry_version "${entry_version}")  # RPM's release: 1.slurm22.05
      string(APPEND rpm "* ${CMAKE_MATCH_2} ${CMAKE_MATCH_4} ${CMAKE_MATCH_3} ${CMAKE_MATCH_5} "
        "${CMAKE_MATCH_1} - ${entry_version}\n${items}\n")
      set(items "")
    endif()
  endforeach()
  file(WRITE "${dir}/changelog.rpm" "${rpm}")
endfunction()
set(node_version "${PROJECT_VERSION}-${MONARCH_PACKAGE_RELEASE}")
monarch_package_docs(node monarch "${node_version}")
if(MONARCH_SLURM_RELEASE)
  monarch_package_docs(slurm monarch-slurm-plugin "${node_version}+slurm${MONARCH_SLURM_RELEASE}")
endif()

if(CMAKE_INSTALL_PREFIX STREQUAL "/usr" AND MONARCH_SLURM_RELEASE)
  add_custom_target(packages
    COMMAND "${CMAKE_COMMAND}" -E rm -rf "${CPACK_PACKAGE_DIRECTORY}"
    COMMAND "${CMAKE_CPACK_COMMAND}" --config CPackConfig.cmake -D MONARCH_PACKAGE=node
    COMMAND "${CMAKE_CPACK_COMMAND}" --config CPackConfig.cmake -D MONARCH_PACKAGE=slurm
    COMMAND "${CMAKE_COMMAND}" -E rm -rf "${CPACK_PACKAGE_DIRECTORY}/_CPack_Packages"
    WORKING_DIRECTORY "${PROJECT_BINARY_DIR}" VERBATIM)
else()
  add_custom_target(packages
    COMMAND "${CMAKE_COMMAND}" -E echo "packages: this build is configured for prefix \
'${CMAKE_INSTALL_PREFIX}' and Slurm release '${MONARCH_SLURM_RELEASE}': packages need prefix \
/usr and slurm/spank.h (Debian: libslurm-dev); configure with -DCMAKE_INSTALL_PREFIX=/usr"
    COMMAND "${CMAKE_COMMAND}" -E false VERBATIM)
endif()

include(CPack)
