// In ThreadSanitizer builds this file is compiled without instrumentation (pipeline/CMakeLists):
// its code is oneTBB's flow-graph templates, whose synchronisation partly lives in the
// uninstrumented libtbb and so looks racy to TSan. The node bodies it calls are instrumented and
// annotate their hand-offs (pipeline/tsan.hpp), so races in atfill's own code are still caught.
#include "pipeline/engine_graph.hpp"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/version.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <tuple>

#include "pipeline/tsan.hpp"

namespace atfill::pipeline::internal {
namespace {

namespace flow = tbb::flow;

using WorkNode = flow::multifunction_node<EventChunk*, std::tuple<EventChunk*>>;

class Graph : public GraphHandle {
 public:
  Graph(uint32_t in_flight) : g_(ctx_), limiter_(g_, in_flight) {}
  void Cancel() override { ctx_.cancel_group_execution(); }
  void Release(size_t chunks) override {
    for (size_t i = 0; i < chunks; ++i) limiter_.decrementer().try_put(flow::continue_msg());
  }
  Resumer Hold() override {
    g_.reserve_wait();
    return Resumer{&Graph::ResumeChunk, this};
  }
  void Unhold() override { g_.release_wait(); }
  flow::graph& g() { return g_; }
  flow::limiter_node<EventChunk*>& limiter() { return limiter_; }
  void set_work(WorkNode* work) { work_ = work; }

 private:
  static void ResumeChunk(void* graph, EventChunk* chunk) {
    auto* self = static_cast<Graph*>(graph);
    // The chunk queues at the work node like a new one; the hold keeps wait_for_all from
    // returning until the put is done.
    self->work_->try_put(chunk);
    self->g_.release_wait();
  }

  tbb::task_group_context ctx_;
  flow::graph g_;
  flow::limiter_node<EventChunk*> limiter_;
  WorkNode* work_ = nullptr;
};

using WriteNode = flow::async_node<SealedBatch*, flow::continue_msg>;

// One thread that writes sealed batches in the order they were pushed, each holding its graph open
// (reserve_wait) until it is written.
class SinkThread {
 public:
  explicit SinkThread(GraphBodies* bodies) : bodies_(bodies), thread_([this] { Loop(); }) {}
  ~SinkThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Push(SealedBatch* batch, WriteNode::gateway_type* gateway) {
    // Notified under the lock: the destructor takes the lock before the condition variable dies.
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(batch, gateway);
    cv_.notify_one();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return done_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [batch, gateway] = queue_.front();
      queue_.pop_front();
      lock.unlock();
      bodies_->Write(batch);
      gateway->release_wait();
      lock.lock();
    }
  }

  GraphBodies* bodies_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<SealedBatch*, WriteNode::gateway_type*>> queue_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

void RunGraph(GraphBodies* bodies, uint32_t workers, uint32_t in_flight) {
  Graph graph(in_flight);
  flow::graph& g = graph.g();
  flow::input_node<EventChunk*> reader(g, [bodies](tbb::flow_control& fc) -> EventChunk* {
    EventChunk* chunk = bodies->Read();
    if (chunk == nullptr) fc.stop();
    return chunk;
  });
  // A chunk an asynchronous stage took leaves the node without an output and frees its worker;
  // it comes back through Graph::ResumeChunk to the same node.
  WorkNode work(g, workers, [bodies](EventChunk* chunk, WorkNode::output_ports_type& out) {
    if (bodies->Work(chunk)) std::get<0>(out).try_put(chunk);
  });
  graph.set_work(&work);
  flow::sequencer_node<EventChunk*> sequencer(g, [](EventChunk* const& c) { return c->seq; });
  using OrderNode = flow::multifunction_node<EventChunk*, std::tuple<SealedBatch*>>;
  OrderNode order(g, flow::serial, [bodies](EventChunk* chunk, OrderNode::output_ports_type& out) {
    if (SealedBatch* batch = bodies->Order(chunk)) std::get<0>(out).try_put(batch);
  });
  // The sink writes on a thread of its own, entering the graph through an async_node as I/O does:
  // a flow-graph worker never blocks on the database, and the sink never waits for a free worker
  // behind decode tasks. The gateway's reserve_wait keeps the graph from finishing while a batch
  // is still being written. Serial, so batches reach the thread in the order they were sealed.
  SinkThread sink(bodies);
  WriteNode write(g, flow::serial, [&sink](SealedBatch* batch, WriteNode::gateway_type& gw) {
    // The sink thread's queue was built before the graph started, on this thread's caller.
    HappensAfter(&sink);
    gw.reserve_wait();
    sink.Push(batch, &gw);
  });
  flow::make_edge(reader, graph.limiter());
  flow::make_edge(graph.limiter(), work);
  flow::make_edge(flow::output_port<0>(work), sequencer);
  flow::make_edge(sequencer, order);
  flow::make_edge(flow::output_port<0>(order), write);
  HappensBefore(&sink);
  bodies->Attach(&graph);
  reader.activate();
  g.wait_for_all();
  bodies->Attach(nullptr);
}

}  // namespace atfill::pipeline::internal

namespace atfill::pipeline {

std::string TbbRuntimeVersion() { return TBB_runtime_version(); }

}  // namespace atfill::pipeline
