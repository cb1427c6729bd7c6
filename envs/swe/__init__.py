"""SWE domain: repository bug-fix tasks graded by their FAIL_TO_PASS / PASS_TO_PASS tests."""
