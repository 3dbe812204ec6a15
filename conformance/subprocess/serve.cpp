// The child role of the protocol for any Candidate (PROTOCOL.md). Blocking I/O: the host owns
// the time limits and kills a child that takes too long.
#include <errno.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "normcheck/reference/case.hpp"
#include "protocol.hpp"
#include "subprocess_candidate.hpp"

namespace normcheck::conf {

namespace {

using nlohmann::json;

// The host went away (end of input mid-message, or a write error): nothing more can be said.
struct StreamLost {
  std::string why;
};

class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}

  // The next line without its '\n'; nullopt at end of input before any byte of it.
  std::optional<std::string> line(std::size_t max) {
    for (;;) {
      if (const auto nl = buf_.find('\n', pos_); nl != std::string::npos) {
        std::string out = buf_.substr(pos_, nl - pos_);
        pos_ = nl + 1;
        return out;
      }
      if (buf_.size() - pos_ > max) throw proto::ProtocolError("request header longer than 1 MiB");
      if (!fill()) {
        if (pos_ == buf_.size()) return std::nullopt;
        throw StreamLost{"end of input in the middle of a header"};
      }
    }
  }

  void exact(unsigned char* out, std::size_t n) {
    while (n > 0) {
      if (pos_ == buf_.size() && !fill()) throw StreamLost{"end of input in the middle of a payload"};
      const std::size_t k = std::min(n, buf_.size() - pos_);
      std::memcpy(out, buf_.data() + pos_, k);
      pos_ += k;
      out += k;
      n -= k;
    }
  }

 private:
  // Reads what is available; false at end of input.
  bool fill() {
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    char tmp[1 << 16];
    for (;;) {
      const ssize_t r = ::read(fd_, tmp, sizeof tmp);
      if (r > 0) {
        buf_.append(tmp, static_cast<std::size_t>(r));
        return true;
      }
      if (r == 0) return false;
      if (errno != EINTR) throw StreamLost{fmt::format("read: {}", std::strerror(errno))};
    }
  }

  int fd_;
  std::string buf_;
  std::size_t pos_ = 0;
};

void write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw StreamLost{fmt::format("write: {}", std::strerror(errno))};
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void send(int fd, const json& header) {
  const std::string line = proto::header_line(header);
  write_all(fd, line.data(), line.size());
}

void send_error(int fd, const std::string& message) { send(fd, {{"type", "error"}, {"message", message}}); }

json hello(const CandidateInfo& info) {
  json h = {{"protocol", proto::kName},
            {"version", proto::kVersion},
            {"type", "hello"},
            {"name", info.name},
            {"description", info.description},
            {"kind", name_of(info.kind)},
            {"capabilities", proto::capabilities_json(info.caps)}};
  if (!info.fault_class.empty()) h["fault_class"] = info.fault_class;
  if (!info.fault.empty()) h["fault"] = info.fault;
  return h;
}

// Checks the candidate's outputs against the request before anything is written, so that a
// mistake becomes an `error` reply and not a malformed `result`.
std::optional<std::string> check_outputs(const Outputs& outs, const std::map<std::string, OutputSpec>& want) {
  for (const auto& [name, t] : outs) {
    auto it = want.find(name);
    if (it == want.end())
      return fmt::format("the candidate returned output '{}', which the case does not have", name);
    if (t.dtype != it->second.dtype || t.shape != it->second.shape)
      return fmt::format("the candidate returned output '{}' as {} {}, the case wants {} {}", name,
                         ref::name_of(t.dtype), proto::shape_text(t.shape), ref::name_of(it->second.dtype),
                         proto::shape_text(it->second.shape));
    if (static_cast<std::int64_t>(t.data.size()) != t.numel())
      return fmt::format("the candidate returned output '{}' with {} values for shape {}", name,
                         t.data.size(), proto::shape_text(t.shape));
  }
  return std::nullopt;
}

// Encodes every output first (a value outside its dtype is an error reply, not half a result);
// codes go as the request asked for them (uint8/int8, NVFP4 packed).
void send_result(int fd, const Outputs& outs, const std::map<std::string, OutputSpec>& want) {
  json entries = json::array();
  std::string payload;
  for (const auto& [name, t] : outs) {
    const OutputSpec& spec = want.at(name);  // check_outputs made sure it is there
    try {
      const auto bytes = proto::result_payload(spec, t);
      entries.push_back(proto::result_entry_json(name, spec, t));
      payload.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      send_error(fd, fmt::format("output '{}': {}", name, e.what()));
      return;
    }
  }
  send(fd, {{"type", "result"}, {"outputs", entries}});
  write_all(fd, payload.data(), payload.size());
}

// One `run` request whose header parsed. Throws ProtocolError or StreamLost when the stream is
// lost (the caller gives up), and answers everything else.
void serve_run(Candidate& cand, const json& header, Reader& in, int out_fd) {
  // The tensor list decides where the next message starts: without it nothing can go on.
  const auto entries = proto::parse_entries(header, "inputs");
  ref::Case c;
  for (const auto& e : entries) {
    std::vector<unsigned char> bytes(e.nbytes);
    in.exact(bytes.data(), bytes.size());
    c.inputs[e.name] = proto::decode(e, bytes.data());
  }
  // From here on the request has been read: any problem is an error reply, and serving goes on.
  std::map<std::string, OutputSpec> want;
  try {
    auto inputs = std::move(c.inputs);
    c = proto::case_from_json(header.contains("case") ? header["case"] : json());
    c.inputs = std::move(inputs);
    want = proto::output_specs_from_json(header);
    ref::validate(c);
  } catch (const std::exception& e) {
    send_error(out_fd, fmt::format("bad request: {}", e.what()));
    return;
  }
  if (auto why = cand.declines(c)) {
    send(out_fd, {{"type", "decline"}, {"reason", *why}});
    return;
  }
  Outputs outs;
  try {
    outs = cand.run(c);
  } catch (const CandidateDeclined& e) {
    send(out_fd, {{"type", "decline"}, {"reason", e.what()}});
    return;
  } catch (const std::exception& e) {
    send_error(out_fd, e.what());
    return;
  } catch (...) {
    send_error(out_fd, "the candidate threw an exception that is not a std::exception");
    return;
  }
  if (auto why = check_outputs(outs, want)) {
    send_error(out_fd, *why);
    return;
  }
  send_result(out_fd, outs, want);
}

}  // namespace

void serve_startup_error(const std::string& message, int out_fd) {
  try {
    send_error(out_fd, message);
  } catch (const StreamLost&) {
    // The host is gone; the exit status is all that is left to say.
  }
}

int serve_protocol(Candidate& cand, int in_fd, int out_fd) {
  Reader in(in_fd);
  try {
    send(out_fd, hello(cand.info()));
    for (;;) {
      json header;
      try {
        auto line = in.line(proto::kMaxHeaderBytes);
        if (!line) return 0;
        header = proto::parse_header(*line);
      } catch (const proto::ProtocolError& e) {
        send_error(out_fd, fmt::format("malformed request, giving up: {}", e.what()));
        return 2;
      }
      const auto type = header["type"].get<std::string>();
      if (type == "bye") return 0;
      if (type != "run") {
        // An unknown request may carry a payload of unknown length: the stream is lost.
        send_error(out_fd, fmt::format("unknown request type '{}', giving up", type));
        return 2;
      }
      try {
        serve_run(cand, header, in, out_fd);
      } catch (const proto::ProtocolError& e) {
        send_error(out_fd, fmt::format("malformed request, giving up: {}", e.what()));
        return 2;
      }
    }
  } catch (const StreamLost&) {
    return 2;
  }
}

}  // namespace normcheck::conf
