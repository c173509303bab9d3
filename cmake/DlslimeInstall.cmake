include(CMakePackageConfigHelpers)

if(SKBUILD)
  # pip install: the library goes next to the extension module inside the package
  # (the module finds it through RPATH $ORIGIN).
  install(TARGETS dlslime LIBRARY DESTINATION dlslime)
  if(TARGET dlslime_sim_ibverbs)
    install(TARGETS dlslime_sim_ibverbs LIBRARY DESTINATION dlslime)
  endif()
  if(TARGET dlslime_sim_cudart)
    install(TARGETS dlslime_sim_cudart LIBRARY DESTINATION dlslime)
  endif()
  return()
endif()

install(TARGETS dlslime EXPORT dlslimeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The simulated RDMA device's library goes beside libdlslime, where the RDMA adapter
# looks for it under DLSLIME_RDMA_SIM=1 (other programs may load it as libibverbs).
if(TARGET dlslime_sim_ibverbs)
  install(TARGETS dlslime_sim_ibverbs LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# Likewise the simulated GPU's library, where the GPU adapter looks under DLSLIME_GPU_SIM=1
# (other programs may load it as libcudart).
if(TARGET dlslime_sim_cudart)
  install(TARGETS dlslime_sim_cudart LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dlslime
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/dlslime/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dlslime)

set(DLSLIME_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dlslime)
install(EXPORT dlslimeTargets NAMESPACE dlslime:: DESTINATION ${DLSLIME_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dlslimeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dlslimeConfig.cmake
  INSTALL_DESTINATION ${DLSLIME_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dlslimeConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dlslimeConfig.cmake ${PROJECT_BINARY_DIR}/dlslimeConfigVersion.cmake
  DESTINATION ${DLSLIME_CMAKE_DIR})
