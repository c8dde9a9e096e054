# The dependency rules of docs/design/architecture.md, enforced by the build: before any of the
# library's sources compiles, tests/docs/check_layering.py reads every #include "..." of the tree
# against its folder's rule, and an include the rules forbid fails the build, naming file, line and
# rule (the same check is the test layering:includes). It runs again when a source, the rules or
# the checker change. Needs a Python 3 interpreter; without one the build says so and goes on.
# find_program, not find_package(Python3): the package would steer pybind11 to FindPython3's
# Interpreter-only result when the Python module is configured later.
find_program(DFP_LAYERING_PYTHON python3 DOC "The interpreter that runs the build's layering check")
if(DFP_LAYERING_PYTHON)
  file(GLOB_RECURSE _dfp_layered CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/*.h ${PROJECT_SOURCE_DIR}/include/*.hpp
       ${PROJECT_SOURCE_DIR}/simd/*.cpp ${PROJECT_SOURCE_DIR}/simd/*.hpp ${PROJECT_SOURCE_DIR}/simd/*.inc
       ${PROJECT_SOURCE_DIR}/src/*.cpp ${PROJECT_SOURCE_DIR}/src/*.hpp ${PROJECT_SOURCE_DIR}/src/*.cu
       ${PROJECT_SOURCE_DIR}/models/*.cpp ${PROJECT_SOURCE_DIR}/apps/*.cpp ${PROJECT_SOURCE_DIR}/apps/*.hpp
       ${PROJECT_SOURCE_DIR}/python/src/*.cpp ${PROJECT_SOURCE_DIR}/python/src/*.hpp)
  add_custom_command(
    OUTPUT ${CMAKE_BINARY_DIR}/layering.ok
    COMMAND ${DFP_LAYERING_PYTHON} ${PROJECT_SOURCE_DIR}/tests/docs/check_layering.py --quiet
    COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_BINARY_DIR}/layering.ok
    DEPENDS ${_dfp_layered} ${PROJECT_SOURCE_DIR}/docs/design/architecture.md
            ${PROJECT_SOURCE_DIR}/tests/docs/check_layering.py
    COMMENT "Checking every #include against the dependency rules of docs/design/architecture.md"
    VERBATIM)
  add_custom_target(dfp_layering DEPENDS ${CMAKE_BINARY_DIR}/layering.ok)
else()
  message(STATUS "dfp: no Python 3 interpreter: the build does not check the dependency rules (the test layering:includes does)")
  add_custom_target(dfp_layering)
endif()

# One object library per folder of the dependency table: its sources, the third-party libraries
# that folder uses (PRIVATE), and the layering check before it compiles. libdfp is their objects
# together (dfp_add_folder adds them).
function(dfp_add_folder name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINKS" ${ARGN})
  add_library(dfp_${name} OBJECT ${ARG_SOURCES})
  target_compile_features(dfp_${name} PRIVATE cxx_std_20)
  target_include_directories(dfp_${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  if(ARG_LINKS)
    target_link_libraries(dfp_${name} PRIVATE ${ARG_LINKS})
  endif()
  add_dependencies(dfp_${name} dfp_layering)
  target_sources(dfp PRIVATE $<TARGET_OBJECTS:dfp_${name}>)
endfunction()
