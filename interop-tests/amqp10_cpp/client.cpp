// A small Qpid Proton C++ sender/receiver for the interop suite (test_amqp10_cpp.py builds it).
//
//   client send    HOST:PORT ADDRESS COUNT PREFIX   sends PREFIX-0 .. PREFIX-(COUNT-1), unsettled,
//                                                   and exits 0 once the broker accepted each
//   client receive HOST:PORT ADDRESS COUNT          prints COUNT messages, one line each:
//                                                   body <TAB> subject <TAB> key=value;... (sorted)
//
// Logs in as guest/guest with SASL PLAIN. Exit status 2: a transfer was not accepted or the
// broker closed the link or connection with an error (printed on stderr).
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/delivery.hpp>
#include <proton/error_condition.hpp>
#include <proton/message.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/receiver.hpp>
#include <proton/receiver_options.hpp>
#include <proton/scalar.hpp>
#include <proton/sender.hpp>
#include <proton/tracker.hpp>
#include <proton/types.hpp>
#include <proton/value.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

namespace {

std::string text(const proton::value& v) {
    if (v.type() == proton::BINARY) {
        proton::binary b = proton::get<proton::binary>(v);
        return std::string(b.begin(), b.end());
    }
    if (v.type() == proton::STRING) return proton::get<std::string>(v);
    return proton::to_string(v);
}

class client : public proton::messaging_handler {
  public:
    client(std::string mode, std::string url, std::string address, int count, std::string prefix)
        : mode_(mode), url_(url), address_(address), count_(count), prefix_(prefix) {}

    int status = 0;

    void on_container_start(proton::container& c) override {
        proton::connection_options opts;
        opts.user("guest").password("guest").sasl_allowed_mechs("PLAIN")
            .sasl_allow_insecure_mechs(true).container_id("cpp-" + mode_);
        c.connect(url_, opts);
    }

    void on_connection_open(proton::connection& c) override {
        if (mode_ == "send")
            c.open_sender(address_);
        else
            c.open_receiver(address_, proton::receiver_options().credit_window(10));
    }

    void on_sendable(proton::sender& s) override {
        while (s.credit() > 0 && sent_ < count_) {
            proton::message m;
            m.body(prefix_ + "-" + std::to_string(sent_));
            m.id(proton::message_id(uint64_t(sent_)));
            m.subject("from-cpp");
            m.content_type("text/plain");
            m.durable(true);
            m.properties().put("lang", "c++");
            m.properties().put("seq", int32_t(sent_));
            s.send(m);
            ++sent_;
        }
    }

    void on_tracker_accept(proton::tracker& t) override {
        if (++accepted_ == count_) t.connection().close();
    }

    void on_tracker_reject(proton::tracker& t) override { fail(t.connection(), "rejected"); }
    void on_tracker_release(proton::tracker& t) override { fail(t.connection(), "released"); }

    void on_message(proton::delivery& d, proton::message& m) override {
        std::map<std::string, std::string> props;
        for (const auto& kv : proton::get<std::map<std::string, proton::scalar>>(
                 proton::value(m.properties().value())))
            props[kv.first] = proton::to_string(kv.second);
        std::string joined;
        for (const auto& kv : props) joined += (joined.empty() ? "" : ";") + kv.first + "=" + kv.second;
        std::cout << text(m.body()) << '\t' << m.subject() << '\t' << joined << std::endl;
        if (++received_ == count_) d.connection().close();
    }

    void on_error(const proton::error_condition& e) override {
        std::cerr << "error: " << e.what() << std::endl;
        status = 2;
    }

  private:
    void fail(proton::connection c, const char* what) {
        std::cerr << "transfer " << what << std::endl;
        status = 2;
        c.close();
    }

    std::string mode_, url_, address_;
    int count_;
    std::string prefix_;
    int sent_ = 0, accepted_ = 0, received_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 5 || (std::string(argv[1]) == "send" && argc < 6)) {
        std::cerr << "usage: client send|receive HOST:PORT ADDRESS COUNT [PREFIX]" << std::endl;
        return 64;
    }
    client h(argv[1], argv[2], argv[3], std::atoi(argv[4]), argc > 5 ? argv[5] : "");
    try {
        proton::container(h).run();
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << std::endl;
        return 2;
    }
    return h.status;
}
