# Read by cpack for each run (CPACK_PROJECT_CONFIG_FILE): picks the package
# of this run, MONARCH_PACKAGE=node or MONARCH_PACKAGE=slurm (package.cmake's
# `packages` target runs both), and sets what differs between the two.
cmake_policy(VERSION 3.25)
set(release "${CPACK_MONARCH_RELEASE}")
set(slurm_release "${CPACK_MONARCH_SLURM_RELEASE}")
set(node_version "${CPACK_PACKAGE_VERSION}-${release}")
if(MONARCH_PACKAGE STREQUAL "node")
  set(CPACK_COMPONENTS_ALL node)
  set(CPACK_DEBIAN_PACKAGE_RELEASE "${release}")
  set(CPACK_RPM_PACKAGE_RELEASE "${release}")
  set(CPACK_RPM_CHANGELOG_FILE "${CPACK_MONARCH_BINARY_DIR}/package/node/changelog.rpm")
elseif(MONARCH_PACKAGE STREQUAL "slurm")
  set(CPACK_COMPONENTS_ALL slurm)
  # The Slurm release in the version: 0.1.0-1+slurm22.05 (RPM: release 1.slurm22.05).
  set(CPACK_DEBIAN_PACKAGE_RELEASE "${release}+slurm${slurm_release}")
  set(CPACK_RPM_PACKAGE_RELEASE "${release}.slurm${slurm_release}")
  set(CPACK_RPM_CHANGELOG_FILE "${CPACK_MONARCH_BINARY_DIR}/package/slurm/changelog.rpm")
  # Any 22.05.x: every Debian host that runs Slurm (slurmd, or only sbatch and
  # srun) has slurm-wlm-basic-plugins of exactly its Slurm version; SchedMD's
  # RPMs put the same in "slurm".
  # e2fsprogs: mke2fs makes the jobs' images (job_space = image).
  set(CPACK_DEBIAN_SLURM_PACKAGE_DEPENDS "monarch (= ${node_version}), e2fsprogs, \
slurm-wlm-basic-plugins (>= ${slurm_release}), \
slurm-wlm-basic-plugins (<< ${CPACK_MONARCH_SLURM_NEXT_RELEASE})")
  set(CPACK_RPM_SLURM_PACKAGE_REQUIRES "monarch = ${node_version}, e2fsprogs, \
slurm >= ${slurm_release}, \
slurm < ${CPACK_MONARCH_SLURM_NEXT_RELEASE}")
else()
  message(FATAL_ERROR "MONARCH_PACKAGE='${MONARCH_PACKAGE}': accepted: node, slurm. "
    "Build the packages with: cmake --build BUILD --target packages")
endif()
