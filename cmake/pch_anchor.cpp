// Compiles nothing of its own: ddp_core_pch and ddp_test_pch exist to make
// the precompiled headers that other targets share (cmake/compile_cost.cmake).
