#include "tests/bazel/plugin_stub.h"

int cuvil_test_plugin_version(void) { return 1; }
