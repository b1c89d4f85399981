# The same as project(VERSION) in kvscope's CMakeLists.txt (a test checks that they agree).
__version__ = "0.2.0"
