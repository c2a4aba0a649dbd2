# Included by CMake right after llama.cpp's project() (scripts/setup passes CMAKE_PROJECT_llama.cpp_INCLUDE) when it
# builds llama-cpp-python with the flags it chose itself. llama-cpp-python forces llama.cpp's common library on (a
# cache FORCE), yet its wheel ships no part of it: common and cpp-httplib were half of the first build on 2 cores.
# A normal variable in llama.cpp's own scope wins over that cache entry (policy CMP0077), so common is neither
# configured, built nor installed. llama.cpp's tools need it: setup's tools step turns LLAMA_BUILD_TOOLS on, and
# common comes back for them.
if(NOT LLAMA_BUILD_TOOLS)
    set(LLAMA_BUILD_COMMON OFF)
endif()
