// A thin driver of the reference's quantization codec for quant_crosscheck.py: reads lines
// "enc ELEM HEXFLOAT" or "dec ELEM CODE" (ELEM: e4m3fn, e5m2, int8, e2m1) and prints one line
// each: the code, or the decoded value as a hex float ("nan", "inf", "-inf").
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "normcheck/reference/dtype.hpp"
#include "normcheck/reference/quant.hpp"

int main() {
  using namespace normcheck::ref;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op, elem, arg;
    in >> op >> elem >> arg;
    Elem e;
    if (elem == "e4m3fn") e = Elem::e4m3fn;
    else if (elem == "e5m2") e = Elem::e5m2;
    else if (elem == "int8") e = Elem::int8;
    else if (elem == "e2m1") e = Elem::e2m1;
    else {
      std::cerr << "unknown element format '" << elem << "'\n";
      return 2;
    }
    if (op == "enc") std::cout << encode(e, std::strtod(arg.c_str(), nullptr)) << '\n';
    else if (op == "dec") std::cout << hex_text(decode(e, std::atoi(arg.c_str()))) << '\n';
    else {
      std::cerr << "unknown op '" << op << "'\n";
      return 2;
    }
  }
  return 0;
}
