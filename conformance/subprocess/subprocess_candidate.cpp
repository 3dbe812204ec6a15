// The host role of the protocol (PROTOCOL.md): a Candidate whose work is done by a child
// process. Every wait is bounded by a deadline, a child that dies or hangs costs one case (it is
// replaced at the next one), and nothing the child does can stop normcheck: no SIGPIPE, no
// unbounded buffer, no blocking read.
#include "subprocess_candidate.hpp"

#include <errno.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "protocol.hpp"
#include "transports.hpp"

extern char** environ;

namespace normcheck::conf {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

constexpr double kDefaultHelloTimeoutS = 120;
constexpr int kMaxFailedStarts = 3;
constexpr std::size_t kChunkBytes = std::size_t{1} << 16;
// While the host is still writing a request it also reads the child's stdout (a child that
// answers early must not deadlock against a full pipe), but only up to this much.
constexpr std::size_t kMaxBufferedWhileWriting = std::size_t{16} << 20;

Deadline deadline_after(double seconds) {
  // Beyond a few decades the conversion below would overflow: that is no limit either.
  if (seconds <= 0 || seconds > 1e9) return Deadline::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The child closed its stdout (or its stdin, while the host was writing). `context` says what
// was going on; `cut_reply` when a reply had begun and was cut off (a protocol error).
struct ChildGone {
  std::string context;
  bool cut_reply = false;
};
struct TimedOut {};
// The child could not be started or its handshake failed.
struct StartError {
  std::string message;
  // The child died (child_failed) or hung (hung) before its hello: the candidate cannot run,
  // which `run` reports per case; otherwise the spec or the handshake is wrong (input error).
  bool child_failed = false, hung = false;
};

std::string signal_text(int sig) {
  static const std::pair<int, const char*> names[] = {
      {SIGSEGV, "SIGSEGV"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGILL, "SIGILL"},   {SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},
      {SIGPIPE, "SIGPIPE"}, {SIGHUP, "SIGHUP"},   {SIGTRAP, "SIGTRAP"}, {SIGSYS, "SIGSYS"},
      {SIGXCPU, "SIGXCPU"}, {SIGQUIT, "SIGQUIT"}, {SIGALRM, "SIGALRM"}, {SIGUSR1, "SIGUSR1"},
      {SIGUSR2, "SIGUSR2"}};
  for (const auto& [n, text] : names)
    if (n == sig) return fmt::format("signal {} ({})", sig, text);
  return fmt::format("signal {}", sig);
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by {}{}", signal_text(WTERMSIG(status)),
                       WCOREDUMP(status) ? " (core dumped)" : "");
  return fmt::format("ended with wait status {}", status);
}

// Blocks SIGPIPE in this thread while it writes to the child: a write to a dead child then
// fails with EPIPE instead of killing normcheck. A SIGPIPE raised meanwhile is consumed before
// the mask is restored. Thread-local, so the rest of the program's signal handling is untouched.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&set_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t set_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// A running child with its three pipes. All I/O is non-blocking under poll().
class Child {
 public:
  Child(const std::vector<std::string>& argv, std::size_t tail_bytes) : tail_max_(tail_bytes) {
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    // O_CLOEXEC: another thread's child must not inherit these ends, or this child's exit would
    // never show as end of file. posix_spawn's dup2 onto 0/1/2 clears the flag for the child.
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
        if (fd >= 0) ::close(fd);
      throw StartError{fmt::format("cannot create pipes: {}", std::strerror(e))};
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    // The child starts with default signal handling and an empty mask whatever this thread has
    // (a SIGPIPE ignored or blocked here would otherwise be inherited).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawnp(&pid_, args[0], &actions, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
    if (rc != 0) {
      close_fd(in_);
      close_fd(out_);
      close_fd(err_);
      pid_ = -1;
      throw StartError{fmt::format("cannot start '{}': {}", argv[0], std::strerror(rc))};
    }
    set_nonblocking(in_);
    set_nonblocking(out_);
    set_nonblocking(err_);
  }

  ~Child() {
    kill_and_reap();
    close_fd(in_);
    close_fd(out_);
    close_fd(err_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void write_all(const void* data, std::size_t n, Deadline dl) {
    const SigpipeBlock block;
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) pump(dl, &p, &n);
  }

  // The next header line (without '\n'). Throws ChildGone, TimedOut, ProtocolError.
  std::string read_line(Deadline dl) {
    for (;;) {
      if (const auto nl = buf_.find('\n', scan_); nl != std::string::npos) {
        std::string line = buf_.substr(pos_, nl - pos_);
        pos_ = scan_ = nl + 1;
        compact();
        return line;
      }
      scan_ = buf_.size();
      if (buf_.size() - pos_ >= proto::kMaxHeaderBytes)
        throw proto::ProtocolError("a header line is longer than 1 MiB (is the child printing to stdout?)");
      if (out_eof_) {
        if (buf_.size() == pos_) throw ChildGone{};
        throw ChildGone{
            fmt::format("the reply was cut off after {} bytes of its header line", buf_.size() - pos_), true};
      }
      pump(dl, nullptr, nullptr);
    }
  }

  void read_exact(unsigned char* out, std::size_t n, Deadline dl, const std::string& what) {
    const std::size_t want = n;
    for (;;) {
      const std::size_t k = std::min(n, buf_.size() - pos_);
      std::memcpy(out, buf_.data() + pos_, k);
      pos_ += k;
      out += k;
      n -= k;
      scan_ = std::max(scan_, pos_);
      compact();
      if (n == 0) return;
      if (out_eof_)
        throw ChildGone{fmt::format("short payload: {} of the {} bytes of {}", want - n, want, what), true};
      pump(dl, nullptr, nullptr);
    }
  }

  // After ChildGone: gives the child a second to exit (it closed its stdout, so it is usually
  // exiting), kills it otherwise, and says how it ended.
  std::string finish() {
    const auto until = Clock::now() + std::chrono::seconds(1);
    while (!reaped_ && Clock::now() < until) {
      if (try_reap()) break;
      pollfd p{err_, POLLIN, 0};
      if (err_ >= 0 && !err_eof_ && ::poll(&p, 1, 10) > 0)
        drain_stderr();
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string how;
    if (reaped_) {
      how = status_text(status_);
    } else {
      kill_and_reap();
      how = "closed its end of the pipe without exiting (it was killed)";
    }
    drain_stderr();
    return how;
  }

  // Ends the child for good (a timeout, a protocol error, a failed handshake).
  void kill_and_reap() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    drain_stderr();  // after its death all it wrote is in the pipe
  }

  // The polite end: `bye` (sent by the caller), end of input, a little time, then SIGKILL.
  void close_and_wait(std::chrono::milliseconds grace) {
    close_fd(in_);
    const auto until = Clock::now() + grace;
    while (!try_reap() && Clock::now() < until) {
      // Keep the stderr pipe drained, or a chatty child could block on it instead of exiting.
      pollfd p{err_, POLLIN, 0};
      if (err_ >= 0 && !err_eof_ && ::poll(&p, 1, 10) > 0)
        drain_stderr();
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill_and_reap();
  }

  // The last bytes of the child's stderr, for error messages ("" if it wrote nothing).
  std::string tail_text() {
    drain_stderr();
    std::string t = tail_;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    if (t.empty()) return "";
    return fmt::format("\n--- stderr of the candidate (last {} bytes) ---\n{}", t.size(), t);
  }

  bool exited() { return try_reap(); }

 private:
  bool try_reap() {
    if (reaped_) return true;
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) reaped_ = true;
    return reaped_;
  }

  void compact() {
    // Drop consumed bytes now and then, not on every read (that would be quadratic).
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = scan_ = 0;
    } else if (pos_ > kChunkBytes * 16) {
      buf_.erase(0, pos_);
      scan_ -= pos_;
      pos_ = 0;
    }
  }

  // One round of poll(): stderr drained, stdout appended to buf_, and (when *wlen > 0) some of
  // *w written to the child's stdin. Throws TimedOut at the deadline, ChildGone when the child
  // closed its stdin under a write.
  void pump(Deadline dl, const unsigned char** w, std::size_t* wlen) {
    pollfd fds[3];
    nfds_t nf = 0;
    int iout = -1, ierr = -1, iin = -1;
    const bool writing = w && wlen && *wlen > 0;
    if (!out_eof_ && (!writing || buf_.size() - pos_ < kMaxBufferedWhileWriting)) {
      fds[nf] = {out_, POLLIN, 0};
      iout = static_cast<int>(nf++);
    }
    if (!err_eof_) {
      fds[nf] = {err_, POLLIN, 0};
      ierr = static_cast<int>(nf++);
    }
    if (writing) {
      fds[nf] = {in_, POLLOUT, 0};
      iin = static_cast<int>(nf++);
    }
    int wait_ms = -1;
    if (dl != Deadline::max()) {
      const auto left = dl - Clock::now();
      if (left <= Clock::duration::zero()) throw TimedOut{};
      wait_ms = static_cast<int>(
          std::min<std::int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
    }
    // Nothing to wait on means stdout is closed, which the callers check before they pump.
    if (nf == 0) throw ChildGone{};
    const int r = ::poll(fds, nf, wait_ms);
    if (r < 0) {
      if (errno == EINTR) return;
      throw ChildGone{fmt::format("poll: {}", std::strerror(errno))};
    }
    if (r == 0) {
      if (dl != Deadline::max() && Clock::now() >= dl) throw TimedOut{};
      return;
    }
    if (ierr >= 0 && fds[ierr].revents) drain_stderr();
    if (iout >= 0 && fds[iout].revents) {
      const std::size_t old = buf_.size();
      buf_.resize(old + kChunkBytes);
      const ssize_t n = ::read(out_, buf_.data() + old, kChunkBytes);
      buf_.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) out_eof_ = true;
    }
    if (iin >= 0 && fds[iin].revents) {
      const ssize_t n = ::write(in_, *w, *wlen);
      if (n > 0) {
        *w += n;
        *wlen -= static_cast<std::size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        throw ChildGone{"it stopped reading its input"};
      }
    }
  }

  void drain_stderr() {
    if (err_ < 0 || err_eof_) return;
    char tmp[1 << 14];
    for (;;) {
      const ssize_t n = ::read(err_, tmp, sizeof tmp);
      if (n > 0) {
        tail_.append(tmp, static_cast<std::size_t>(n));
        if (tail_.size() > tail_max_) {
          std::size_t cut = tail_.size() - tail_max_;
          // Start the tail at a character boundary of UTF-8 text.
          while (cut < tail_.size() && (static_cast<unsigned char>(tail_[cut]) & 0xC0) == 0x80) ++cut;
          tail_.erase(0, cut);
        }
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) err_eof_ = true;
      if (n < 0 && errno == EINTR) continue;
      return;
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  int in_ = -1, out_ = -1, err_ = -1;
  bool out_eof_ = false, err_eof_ = false;
  std::string buf_;  // bytes read from stdout, consumed from pos_
  std::size_t pos_ = 0;
  std::size_t scan_ = 0;  // buf_ holds no '\n' in [pos_, scan_)
  std::string tail_;
  std::size_t tail_max_;
};

// The hello, checked (PROTOCOL.md, "hello"). Throws StartError.
CandidateInfo parse_hello(const json& h, const std::string& name) {
  const auto type = h["type"].get<std::string>();
  if (type == "error") {
    const auto it = h.find("message");
    throw StartError{fmt::format("the candidate could not start: {}",
                                 it != h.end() && it->is_string() ? it->get<std::string>() : h.dump())};
  }
  const auto proto_it = h.find("protocol");
  const auto version_it = h.find("version");
  if (type != "hello" || proto_it == h.end() || !proto_it->is_string())
    throw StartError{fmt::format("protocol error: the first message is not a {} hello: {}", proto::kName,
                                 proto::header_line(h).substr(0, 200))};
  const std::string speaks = proto_it->get<std::string>();
  const std::string version = version_it == h.end() ? "(none)" : version_it->dump();
  if (speaks != proto::kName || version_it == h.end() || !version_it->is_number_integer() ||
      version_it->get<std::int64_t>() != proto::kVersion)
    throw StartError{fmt::format("the candidate speaks {} version {}; this normcheck speaks {} version {}",
                                 speaks, version, proto::kName, proto::kVersion)};
  CandidateInfo info;
  info.name = name;
  const auto name_it = h.find("name");
  if (name_it == h.end() || !name_it->is_string())
    throw StartError{"protocol error: the hello has no string 'name'"};
  info.description = name_it->get<std::string>();
  if (auto it = h.find("description"); it != h.end() && it->is_string() && !it->get<std::string>().empty())
    info.description += ": " + it->get<std::string>();
  if (auto it = h.find("kind"); it != h.end() && it->is_string()) {
    for (auto k : {CandidateKind::correct, CandidateKind::mutant, CandidateKind::external})
      if (name_of(k) == it->get<std::string>()) info.kind = k;
  }
  if (auto it = h.find("fault_class"); it != h.end() && it->is_string())
    info.fault_class = it->get<std::string>();
  if (auto it = h.find("fault"); it != h.end() && it->is_string()) info.fault = it->get<std::string>();
  try {
    info.caps = proto::capabilities_from_json(h.contains("capabilities") ? h["capabilities"] : json());
  } catch (const proto::ProtocolError& e) {
    throw StartError{fmt::format("protocol error in the hello: {}", e.what())};
  }
  return info;
}

class SubprocessCandidate final : public Candidate {
 public:
  SubprocessCandidate(std::vector<std::string> argv, const std::string& name, const SubprocessOptions& opt)
      : argv_(std::move(argv)), name_(name), opt_(opt) {
    try {
      child_ = start(&info_);
    } catch (const StartError& e) {
      const std::string what = fmt::format("{}: {}", name_, e.message);
      if (e.child_failed || e.hung) throw CandidateStartError(what, e.hung);
      throw std::invalid_argument(what);
    }
  }

  ~SubprocessCandidate() override {
    if (!child_) return;
    try {
      child_->write_all("{\"type\":\"bye\"}\n", 15, deadline_after(1));
    } catch (...) {
      // It is gone or stuck either way; close_and_wait ends it.
    }
    child_->close_and_wait(std::chrono::seconds(2));
  }

  const CandidateInfo& info() const override { return info_; }

  Outputs run(const ref::Case& c) override {
    // A child that died between cases (nothing was asked of it) is replaced without charging
    // this case for it.
    if (child_ && child_->exited()) child_.reset();
    if (!child_) restart();
    const Deadline dl = deadline_after(opt_.timeout_s);
    const auto specs = output_specs(c);
    ++requests_;
    try {
      send_request(c, specs, dl);
      return read_reply(specs, dl);
    } catch (const TimedOut&) {
      child_->kill_and_reap();
      const std::string tail = child_->tail_text();
      child_.reset();
      throw CandidateTimeout(
          fmt::format("no reply within {} s; the candidate was killed (a fresh one serves the next case){}",
                      opt_.timeout_s, tail));
    } catch (const ChildGone& g) {
      const std::string how = child_->finish();
      const std::string tail = child_->tail_text();
      child_.reset();
      if (g.cut_reply)
        throw CandidateError(fmt::format("protocol error: {}; the candidate {}{}", g.context, how, tail));
      throw CandidateError(fmt::format("the candidate {} before it replied{}{}", how,
                                       g.context.empty() ? "" : " (" + g.context + ")", tail));
    } catch (const proto::ProtocolError& e) {
      child_->kill_and_reap();
      const std::string tail = child_->tail_text();
      child_.reset();
      throw CandidateError(fmt::format("protocol error: {} (the candidate was killed){}", e.what(), tail));
    }
  }

 private:
  std::unique_ptr<Child> start(CandidateInfo* info) {
    auto child = std::make_unique<Child>(argv_, opt_.stderr_tail_bytes);
    const double limit =
        opt_.hello_timeout_s > 0 ? opt_.hello_timeout_s : std::max(opt_.timeout_s, kDefaultHelloTimeoutS);
    json hello;
    try {
      hello = proto::parse_header(child->read_line(deadline_after(limit)));
      *info = parse_hello(hello, name_);
    } catch (const TimedOut&) {
      child->kill_and_reap();
      throw StartError{fmt::format("no hello within {} s (the candidate was killed){}", limit, child->tail_text()),
                       false, true};
    } catch (const ChildGone& g) {
      const std::string how = child->finish();
      throw StartError{fmt::format("the candidate {} before its hello{}{}", how,
                                   g.context.empty() ? "" : " (" + g.context + ")", child->tail_text()),
                       true, false};
    } catch (const proto::ProtocolError& e) {
      child->kill_and_reap();
      throw StartError{fmt::format("protocol error: {}{}", e.what(), child->tail_text())};
    } catch (const StartError& e) {
      // A hello of another version gets a bye, in case the child speaks both and waits for it.
      try {
        child->write_all("{\"type\":\"bye\"}\n", 15, deadline_after(1));
      } catch (...) {
      }
      child->close_and_wait(std::chrono::milliseconds(500));
      throw StartError{e.message + child->tail_text()};
    }
    return child;
  }

  void restart() {
    if (failed_starts_ >= kMaxFailedStarts)
      throw CandidateError(fmt::format("not restarted after {} failed starts; the last: {}", failed_starts_,
                                       last_start_error_));
    try {
      CandidateInfo again;
      child_ = start(&again);
      failed_starts_ = 0;
    } catch (const StartError& e) {
      ++failed_starts_;
      last_start_error_ = e.message;
      throw CandidateError(fmt::format("could not restart the candidate: {}", e.message));
    }
  }

  void send_request(const ref::Case& c, const std::map<std::string, OutputSpec>& specs, Deadline dl) {
    json inputs = json::array();
    for (const auto& [name, t] : c.inputs) inputs.push_back(proto::entry_json(name, t));
    const json header = {{"type", "run"},
                         {"request", requests_},
                         {"case", proto::case_json(c)},
                         {"inputs", inputs},
                         {"outputs", proto::output_specs_json(specs)}};
    const std::string line = proto::header_line(header);
    child_->write_all(line.data(), line.size(), dl);
    // Tensors are encoded and written a chunk at a time: a large case is not copied whole.
    std::vector<unsigned char> chunk;
    for (const auto& [name, t] : c.inputs) {
      const std::size_t size = ref::storage_bytes(t.dtype);
      const std::size_t per_chunk = kChunkBytes / size;
      for (std::size_t i = 0; i < t.data.size(); i += per_chunk) {
        const std::size_t n = std::min(per_chunk, t.data.size() - i);
        chunk.resize(n * size);
        proto::encode(t.data.data() + i, n, t.dtype, chunk.data());
        child_->write_all(chunk.data(), chunk.size(), dl);
      }
    }
  }

  Outputs read_reply(const std::map<std::string, OutputSpec>& specs, Deadline dl) {
    const json h = proto::parse_header(child_->read_line(dl));
    const auto type = h["type"].get<std::string>();
    if (type == "decline") {
      const auto it = h.find("reason");
      throw CandidateDeclined(it != h.end() && it->is_string() ? it->get<std::string>()
                                                               : "declined by the candidate");
    }
    if (type == "error") {
      const auto it = h.find("message");
      throw CandidateError(it != h.end() && it->is_string()
                               ? it->get<std::string>()
                               : "the candidate replied error without a message");
    }
    if (type != "result") throw proto::ProtocolError(fmt::format("unexpected reply type '{}'", type));
    if (auto it = h.find("request"); it != h.end() && *it != json(requests_))
      throw proto::ProtocolError(
          fmt::format("reply to request {} received for request {}", it->dump(), requests_));
    const auto entries = proto::parse_entries(h, "outputs");
    for (const auto& e : entries) {
      const auto it = specs.find(e.name);
      if (it == specs.end()) throw proto::ProtocolError(fmt::format("output '{}' was not requested", e.name));
      const OutputSpec& spec = it->second;
      if (!spec.codes.empty()) {  // codes as the fixture stores them (PROTOCOL.md, "Quantized cases")
        const wire::CodeLayout l = wire::layout_of(spec);
        if (e.codes != l.storage || e.shape != l.shape)
          throw proto::ProtocolError(fmt::format(
              "output '{}' is {} {}; the request asked for {} {} ({} codes{})", e.name, proto::dtype_text(e),
              proto::shape_text(e.shape), wire::name_of(l.storage), proto::shape_text(l.shape), spec.codes,
              l.packed ? ", packed two per byte, element 2k in the low nibble" : ", one per byte"));
      } else if (e.codes || e.dtype != spec.dtype || e.shape != spec.shape) {
        throw proto::ProtocolError(fmt::format(
            "output '{}' is {} {}; the request asked for {} {}", e.name, proto::dtype_text(e),
            proto::shape_text(e.shape), ref::name_of(spec.dtype), proto::shape_text(spec.shape)));
      }
    }
    Outputs outs;
    std::vector<unsigned char> bytes;
    for (const auto& e : entries) {
      bytes.resize(e.nbytes);
      child_->read_exact(bytes.data(), bytes.size(), dl, fmt::format("output '{}'", e.name));
      const OutputSpec& spec = specs.at(e.name);
      outs[e.name] = spec.codes.empty() ? proto::decode(e, bytes.data()) : wire::from_bytes(spec, bytes.data());
    }
    return outs;
  }

  std::vector<std::string> argv_;
  std::string name_;
  SubprocessOptions opt_;
  CandidateInfo info_;
  std::unique_ptr<Child> child_;
  std::uint64_t requests_ = 0;
  int failed_starts_ = 0;
  std::string last_start_error_;
};

}  // namespace

std::unique_ptr<Candidate> make_subprocess_candidate(const std::vector<std::string>& argv,
                                                     const std::string& name, const SubprocessOptions& opt) {
  if (argv.empty()) throw std::invalid_argument(fmt::format("{}: no command to run", name));
  return std::make_unique<SubprocessCandidate>(argv, name, opt);
}

std::unique_ptr<Candidate> make_subprocess_candidate(const std::vector<std::string>& argv,
                                                     const std::string& name, double timeout_s,
                                                     double startup_timeout_s) {
  SubprocessOptions opt;
  opt.timeout_s = timeout_s;
  opt.hello_timeout_s = startup_timeout_s;
  return make_subprocess_candidate(argv, name, opt);
}

namespace {

class UnstartedCandidate final : public Candidate {
 public:
  UnstartedCandidate(const std::string& spec, const CandidateStartError& e) : error_(e.what()), hung_(e.hung()) {
    // A builtin run isolated keeps what it is and what it declares: the cases it would have
    // declined stay UNSUPPORTED, the others fail with the start error.
    for (const auto& b : builtin_candidates())
      if (b.info.name == spec) info_ = b.info, known_caps_ = true;
    info_.name = spec;
    info_.description = "could not start: " + error_;
  }
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case& c) const override {
    return known_caps_ ? unsupported_reason(info_.caps, c) : std::nullopt;
  }
  Outputs run(const ref::Case&) override {
    if (hung_) throw CandidateTimeout(error_);
    throw CandidateError(error_);
  }

 private:
  CandidateInfo info_;
  std::string error_;
  bool hung_;
  bool known_caps_ = false;
};

}  // namespace

std::unique_ptr<Candidate> make_unstarted_candidate(const std::string& spec, const CandidateStartError& e) {
  return std::make_unique<UnstartedCandidate>(spec, e);
}

}  // namespace normcheck::conf
