# Runs the CLI with one bad invocation and checks that it fails the way docs/RELIABILITY.md
# ("Bad inputs, CLI") says: the exit status EXPECT_RC (or any non-zero one when EXPECT_RC is
# "nonzero") and stderr matching EXPECT_STDERR (the argument or file named, what was expected).
#   cmake -DCLI=<sparsemla> -DARGS=<args joined by |> -DEXPECT_RC=<n|nonzero>
#         -DEXPECT_STDERR=<regex> [-DRUN_ENV=<VAR=value>] -P expect_failure.cmake
# A PASS_REGULAR_EXPRESSION test alone would ignore the exit status, hence this script.
string(REPLACE "|" ";" args "${ARGS}")
set(env_prefix "")
if(DEFINED RUN_ENV AND NOT RUN_ENV STREQUAL "")
  set(env_prefix ${CMAKE_COMMAND} -E env ${RUN_ENV})
endif()
execute_process(COMMAND ${env_prefix} ${CLI} ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(REPLACE "|" " " shown "${ARGS}")
if(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0)
    message(FATAL_ERROR "sparsemla ${shown}: exit status 0, expected a failure\nstderr: ${err}")
  endif()
elseif(NOT rc STREQUAL EXPECT_RC)
  message(FATAL_ERROR "sparsemla ${shown}: exit status ${rc}, expected ${EXPECT_RC}\n"
                      "stdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${EXPECT_STDERR}")
  message(FATAL_ERROR "sparsemla ${shown}: stderr does not match '${EXPECT_STDERR}'\n"
                      "stderr: ${err}")
endif()
message(STATUS "sparsemla ${shown}: exit ${rc}, stderr: ${err}")
