/* libbraid_test_no_symbol_plugin.so: a valid shared library that is not a Braid plugin (it
 * exports no braidBackendPlugin_v<N> symbol). */
int braid_test_not_a_plugin(void) { return 42; }
