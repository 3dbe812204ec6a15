# A link interface that judge_link_check.cmake must reject (judge.link_interface_rejects_transports):
# the judge linked against the harness, which brings every transport.
set(judge_links "normcheck::reference;normcheck::fixtures;fmt::fmt;normcheck::conformance")
set(reference_links "")
set(fixtures_links "normcheck::reference")
set(judge_includes "/src/conformance/judge/include")
set(test_links "normcheck::judge;GTest::gtest_main")
set(judge_dir "/src/conformance/judge")
set(conformance_dir "/src/conformance")
