# conformance.ggml.gguf_differential: the audit's GGUF reader against ggml's parser over the
# audit fuzzer's corpus (unpacked from corpus.tar.xz) and the GGUF files the audit tests write
# (gguf_files.py). -D PROGRAM, CORPUS, PYTHON, WRITER, KNOWN, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} -E tar xJf ${CORPUS} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT IS_DIRECTORY ${WORK_DIR}/corpus/gguf)
  message(FATAL_ERROR "could not unpack the GGUF corpus from ${CORPUS} (${rc})")
endif()
execute_process(COMMAND ${PYTHON} ${WRITER} ${WORK_DIR}/written RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gguf_files.py failed (${rc})")
endif()
execute_process(COMMAND ${PROGRAM} --known ${KNOWN} ${WORK_DIR}/corpus/gguf ${WORK_DIR}/written RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the audit's GGUF reader and ggml's parser disagree beyond the known disagreements (${rc})")
endif()
