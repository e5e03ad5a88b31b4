# Included by llama.cpp's project() (CMAKE_PROJECT_INCLUDE): once every directory is
# configured, every target but the executables llmgw runs leaves the default build, so a
# cold `make run` compiles llama-server, rpc-server and llama-fit-params and only the
# libraries they link (a dependency is built all the same) instead of every tool
# llama.cpp ships.
include_guard(GLOBAL)

set(LLMGW_KEEP llama-server ggml-rpc-server rpc-server llama-fit-params)

function(llmgw_keep_only_what_llmgw_runs)
  set(directories "${CMAKE_SOURCE_DIR}")
  while(directories)
    list(POP_FRONT directories directory)
    get_property(children DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
    list(APPEND directories ${children})
    get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(kind ${target} TYPE)
      if(NOT kind STREQUAL "INTERFACE_LIBRARY" AND NOT target IN_LIST LLMGW_KEEP)
        set_target_properties(${target} PROPERTIES EXCLUDE_FROM_ALL ON)
      endif()
    endforeach()
  endwhile()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL llmgw_keep_only_what_llmgw_runs)
