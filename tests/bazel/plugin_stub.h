/* A stand-in plugin for the analysis tests: its header must be an input of the
 * model's compile action, its library a dependency of the model's. */
#ifndef CUVIL_TESTS_PLUGIN_STUB_H
#define CUVIL_TESTS_PLUGIN_STUB_H
int cuvil_test_plugin_version(void);
#endif
