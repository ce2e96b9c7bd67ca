// The one symbol lmcache 0.5.6's cuda_ops needs from libc10 that torch 2.11 does not
// export: NotImplementedError(SourceLocation, std::string). In torch 2.11 the class only
// inherits Error's constructors (`using Error::Error`, emitted inline where used); the
// wheel was built against a later torch that defines it out of line. This library
// defines it under its mangled name, forwarding to the inherited constructor, and is
// preloaded into the LMCache and vLLM processes (LD_PRELOAD) so that
// `import lmcache.cuda_ops` binds instead of falling back to LMCache's torch baseline.
//
// Built by scripts/gpu/stage.sh on the device, against that device's torch headers:
//   g++ -O2 -shared -fPIC -std=c++17 -I$T/include -L$T/lib -Wl,-rpath,$T/lib \
//       -Wl,--version-script=c10shim.map \
//       c10shim.cpp -lc10 -o c10shim.so
// The Itanium C++ ABI passes `this` first, the 24-byte SourceLocation in memory and the
// std::string by invisible reference: the same registers and stack as this free
// function, so the asm label alone makes it the complete-object constructor (C1). The version
// script (c10shim.map) exports that symbol alone: the class's vtable and typeinfo, which
// the compiler emits here too, stay local, so libc10's own copies remain the ones every
// other library binds to.
#include <c10/util/Exception.h>

#include <new>
#include <string>
#include <utility>

extern "C++" void sessiongen_c10_not_implemented_ctor(
    c10::NotImplementedError* self, c10::SourceLocation where, std::string msg)
    asm("_ZN3c1019NotImplementedErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");

void sessiongen_c10_not_implemented_ctor(
    c10::NotImplementedError* self, c10::SourceLocation where, std::string msg) {
  new (self) c10::NotImplementedError(where, std::move(msg));
}
