// The pickle of torch.save's state_dicts (see torch_pickle.hpp).
#include "src/io/torch_pickle.hpp"

#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "dfp/status.hpp"
#include "src/io/torch_zip.hpp"

namespace dfp::torch_format {

using namespace std::string_literals;

const char* dtype_name(Dtype d) noexcept {
  switch (d) {
    case Dtype::float32: return "float32";
    case Dtype::float16: return "float16";
    case Dtype::bfloat16: return "bfloat16";
    case Dtype::int64: return "int64";
  }
  return "?";
}

size_t dtype_size(Dtype d) noexcept { return d == Dtype::float32 ? 4 : d == Dtype::int64 ? 8 : 2; }

namespace {

// The globals a state_dict may name, and nothing else.
enum class Global : uint8_t { ordered_dict, rebuild_tensor, rebuild_parameter, storage };
struct KnownGlobal {
  const char* module;
  const char* name;
  Global kind;
  Dtype dtype;  // storage types
};
constexpr KnownGlobal kGlobals[] = {
    {"collections", "OrderedDict", Global::ordered_dict, Dtype::float32},
    {"torch._utils", "_rebuild_tensor_v2", Global::rebuild_tensor, Dtype::float32},
    {"torch._utils", "_rebuild_parameter", Global::rebuild_parameter, Dtype::float32},
    {"torch", "FloatStorage", Global::storage, Dtype::float32},
    {"torch", "HalfStorage", Global::storage, Dtype::float16},
    {"torch", "BFloat16Storage", Global::storage, Dtype::bfloat16},
    {"torch", "LongStorage", Global::storage, Dtype::int64},
};

// Bounds that no state_dict comes near, so that a hostile pickle cannot exhaust memory.
constexpr size_t kMaxStack = size_t{1} << 20, kMaxMarks = 1024, kMaxObjects = size_t{1} << 24, kMaxDims = 8;
constexpr size_t kMaxGlobalName = 256;
constexpr uint64_t kMaxElements = uint64_t{1} << 62;

struct Obj {
  enum Kind : uint8_t { none, boolean, integer, text, tuple, dict, global, storage, tensor } kind = none;
  int64_t i = 0;          // boolean, integer; global: index into kGlobals; storage, tensor: index;
                          // dict: 1 for a plain dict (EMPTY_DICT), 0 for an OrderedDict
  std::string s;          // text
  std::vector<uint32_t> items;  // tuple; dict: key, value, key, value, ...
};

// A kind with its article, for messages ("an int").
const char* kind_name(Obj::Kind k) {
  static const char* names[] = {"None", "a bool", "an int", "a str", "a tuple", "a dict", "a global", "a storage", "a tensor"};
  return names[k];
}

class Reader {
 public:
  Reader(std::string_view p, const std::string& what) : p_(p), what_(what) {}

  StateDict run() {
    for (;;) {
      op_at_ = pos_;
      op_ = byte();
      if (op_ == '.') break;
      step();
    }
    DFP_CHECK(stack_.size() == 1 && marks_.empty(), Status::corrupt_data,
              where() + "STOP with " + std::to_string(stack_.size()) + " objects on the stack and " +
                  std::to_string(marks_.size()) + " open marks; expected one object");
    return result(stack_.back());
  }

 private:
  [[noreturn]] void bad(const std::string& msg, Status s = Status::corrupt_data) const { fail(s, where() + msg); }
  std::string where() const {
    char op[48];
    if (op_ >= 0x20 && op_ < 0x7f) std::snprintf(op, sizeof op, "opcode 0x%02x ('%c')", op_, op_);
    else std::snprintf(op, sizeof op, "opcode 0x%02x", op_);
    return "torch file '" + what_ + "': pickle byte " + std::to_string(op_at_) + ", " + op + ": ";
  }
  void need(uint64_t n) const {
    if (n > p_.size() - pos_)
      bad("needs " + std::to_string(n) + " more bytes, the pickle has " + std::to_string(p_.size() - pos_) +
          " left (truncated)");
  }
  unsigned char byte() {
    need(1);
    return static_cast<unsigned char>(p_[pos_++]);
  }
  uint64_t uint(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= uint64_t(static_cast<unsigned char>(p_[pos_ + k])) << (8 * k);
    pos_ += n;
    return v;
  }
  std::string bytes(uint64_t n) {
    need(n);
    std::string s(p_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::string line() {
    const size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos) bad("a global's name has no line end (truncated)");
    if (nl - pos_ > kMaxGlobalName) bad("a global's name is longer than 256 bytes");
    std::string s(p_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return s;
  }

  uint32_t make(Obj o) {
    if (objs_.size() >= kMaxObjects) bad("more than " + std::to_string(kMaxObjects) + " objects");
    objs_.push_back(std::move(o));
    return uint32_t(objs_.size() - 1);
  }
  void push(uint32_t o) {
    if (stack_.size() >= kMaxStack) bad("the stack exceeds " + std::to_string(kMaxStack) + " objects");
    stack_.push_back(o);
  }
  void push(Obj o) { push(make(std::move(o))); }
  uint32_t pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) bad("pops an empty stack (or past a mark)");
    const uint32_t o = stack_.back();
    stack_.pop_back();
    return o;
  }
  uint32_t top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) bad("needs an object on the stack");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) bad("no mark to pop to");
    std::vector<uint32_t> items(stack_.begin() + std::ptrdiff_t(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  const Obj& as(uint32_t o, Obj::Kind k, const char* role) const {
    if (objs_[o].kind != k)
      bad(std::string(role) + " is " + kind_name(objs_[o].kind) + "; expected " + kind_name(k), Status::unsupported);
    return objs_[o];
  }
  int64_t integer(uint32_t o, const char* role, int64_t lo) const {
    const int64_t v = as(o, Obj::integer, role).i;
    if (v < lo) bad(std::string(role) + " is " + std::to_string(v) + "; expected >= " + std::to_string(lo));
    return v;
  }
  uint32_t memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) bad("memo entry " + std::to_string(index) + " was never stored");
    return it->second;
  }
  void memo_put(uint64_t index) {
    if (memo_.size() >= kMaxObjects) bad("more than " + std::to_string(kMaxObjects) + " memo entries");
    memo_[index] = top();
  }
  void global(const std::string& module, const std::string& name) {
    for (size_t g = 0; g < std::size(kGlobals); ++g)
      if (module == kGlobals[g].module && name == kGlobals[g].name) return push(Obj{Obj::global, int64_t(g), {}, {}});
    bad("global '" + printable(module + "." + name) + "' is not one a state_dict names (allowed: "
        "collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter, torch.FloatStorage, "
        "torch.HalfStorage, torch.BFloat16Storage, torch.LongStorage); a state_dict file calls nothing else" +
            checkpoint_hint(),
        Status::unsupported);
  }
  void set_items(uint32_t d, const std::vector<uint32_t>& kv) {
    if (objs_[d].kind != Obj::dict) bad("sets items of " + std::string(kind_name(objs_[d].kind)) + "; expected a dict");
    if (kv.size() % 2) bad("an odd number of objects to set as key/value pairs");
    objs_[d].items.insert(objs_[d].items.end(), kv.begin(), kv.end());
  }

  void step() {
    switch (op_) {
      case 0x80: {  // PROTO
        const unsigned v = byte();
        if (v < 2 || v > 5) bad("protocol " + std::to_string(v) + "; expected 2 (torch.save's) to 5", Status::unsupported);
        return;
      }
      case 0x95: uint(8); return;  // FRAME (protocol 4): a length only
      case 'c': {                  // GLOBAL
        const std::string module = line();
        return global(module, line());
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t n = pop(), m = pop();
        return global(as(m, Obj::text, "the module").s, as(n, Obj::text, "the name").s);
      }
      case 'X': return push(Obj{Obj::text, 0, bytes(uint(4)), {}});   // BINUNICODE
      case 0x8c: return push(Obj{Obj::text, 0, bytes(uint(1)), {}});  // SHORT_BINUNICODE
      case 0x8d: return push(Obj{Obj::text, 0, bytes(uint(8)), {}});  // BINUNICODE8
      case 'K': return push(Obj{Obj::integer, int64_t(uint(1)), {}, {}});
      case 'M': return push(Obj{Obj::integer, int64_t(uint(2)), {}, {}});
      case 'J': return push(Obj{Obj::integer, int64_t(int32_t(uint32_t(uint(4)))), {}, {}});
      case 0x8a: {  // LONG1: little-endian two's complement of n <= 8 bytes
        const unsigned n = byte();
        if (n > 8) bad(std::to_string(n) + "-byte integer; expected at most 8");
        uint64_t v = uint(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
        return push(Obj{Obj::integer, int64_t(v), {}, {}});
      }
      case 'N': return push(Obj{Obj::none, 0, {}, {}});
      case 0x88: return push(Obj{Obj::boolean, 1, {}, {}});
      case 0x89: return push(Obj{Obj::boolean, 0, {}, {}});
      case ')': return push(Obj{Obj::tuple, 0, {}, {}});
      case '}': return push(Obj{Obj::dict, 1, {}, {}});
      case '(':
        if (marks_.size() >= kMaxMarks) bad("more than " + std::to_string(kMaxMarks) + " nested marks");
        marks_.push_back(stack_.size());
        return;
      case 't': return push(Obj{Obj::tuple, 0, {}, pop_mark()});
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        std::vector<uint32_t> items(op_ - 0x84);
        for (size_t k = items.size(); k-- > 0;) items[k] = pop();
        return push(Obj{Obj::tuple, 0, {}, std::move(items)});
      }
      case 'q': return memo_put(uint(1));  // BINPUT
      case 'r': return memo_put(uint(4));  // LONG_BINPUT
      case 0x94: return memo_put(memo_.size());  // MEMOIZE
      case 'h': return push(memo_get(uint(1)));  // BINGET
      case 'j': return push(memo_get(uint(4)));  // LONG_BINGET
      case 's': {                                // SETITEM
        const uint32_t v = pop(), k = pop();
        return set_items(top(), {k, v});
      }
      case 'u': {  // SETITEMS
        const std::vector<uint32_t> kv = pop_mark();
        return set_items(top(), kv);
      }
      case 'b': {  // BUILD: an OrderedDict's attributes (a state_dict's _metadata), not needed
        const uint32_t state = pop();
        as(top(), Obj::dict, "the object BUILD sets attributes of");
        as(state, Obj::dict, "BUILD's state");
        return;
      }
      case 'Q': return push(storage(pop()));  // BINPERSID
      case 'R': {                             // REDUCE
        const uint32_t args = pop();
        return push(reduce(as(pop(), Obj::global, "REDUCE's callable"), as(args, Obj::tuple, "REDUCE's arguments")));
      }
      default:
        bad("not an opcode torch.save writes for a state_dict; refused (only plain data and the allowed globals are "
            "read)" + checkpoint_hint(),
            Status::unsupported);
    }
  }

  // BINPERSID's id: ('storage', storage type, key, location, numel).
  uint32_t storage(uint32_t pid) {
    const Obj& t = as(pid, Obj::tuple, "the persistent id");
    if (t.items.size() != 5 || objs_[t.items[0]].kind != Obj::text || objs_[t.items[0]].s != "storage")
      bad("persistent id is not ('storage', type, key, location, size)", Status::unsupported);
    const Obj& type = as(t.items[1], Obj::global, "the storage type");
    if (kGlobals[type.i].kind != Global::storage) bad("the storage type is not a torch storage");
    const std::string& key = as(t.items[2], Obj::text, "the storage key").s;
    as(t.items[3], Obj::text, "the storage location");
    const int64_t numel = integer(t.items[4], "the storage size", 0);
    if (key.empty() || key.size() > 64 ||
        key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos)
      bad("storage key '" + printable(key, 64) + "'; expected letters, digits or '_'");
    if (uint64_t(numel) > kMaxElements) bad("storage of " + std::to_string(numel) + " elements; too many");
    const Dtype dtype = kGlobals[type.i].dtype;
    const auto [it, added] = storage_index_.emplace(key, sd_.storages.size());
    if (added) sd_.storages.push_back({key, dtype, uint64_t(numel)});
    const StorageRef& s = sd_.storages[it->second];
    if (s.dtype != dtype || s.numel != uint64_t(numel))
      bad("storage '" + key + "' named again as " + dtype_name(dtype) + " x " + std::to_string(numel) + ", first as " +
          dtype_name(s.dtype) + " x " + std::to_string(s.numel));
    return make(Obj{Obj::storage, int64_t(it->second), {}, {}});
  }

  bool empty_hooks(uint32_t o) const { return objs_[o].kind == Obj::dict && objs_[o].items.empty(); }

  uint32_t reduce(const Obj& callable, const Obj& args) {
    const std::vector<uint32_t>& a = args.items;
    switch (kGlobals[callable.i].kind) {
      case Global::ordered_dict:
        if (!a.empty()) bad("OrderedDict called with arguments; expected none", Status::unsupported);
        return make(Obj{Obj::dict, 0, {}, {}});
      case Global::rebuild_parameter:  // (tensor, requires_grad, backward_hooks)
        if (a.size() != 3 || objs_[a[0]].kind != Obj::tensor || objs_[a[1]].kind != Obj::boolean || !empty_hooks(a[2]))
          bad("_rebuild_parameter's arguments are not (tensor, bool, empty OrderedDict)", Status::unsupported);
        return a[0];
      case Global::rebuild_tensor: return tensor(a);
      case Global::storage: break;
    }
    bad("calls a storage type; a state_dict names storages only in persistent ids", Status::unsupported);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata]).
  uint32_t tensor(const std::vector<uint32_t>& a) {
    if ((a.size() != 6 && a.size() != 7) || objs_[a[0]].kind != Obj::storage || objs_[a[4]].kind != Obj::boolean ||
        !empty_hooks(a[5]) || (a.size() == 7 && objs_[a[6]].kind != Obj::none && !empty_hooks(a[6])))
      bad("_rebuild_tensor_v2's arguments are not (storage, offset, size, stride, bool, empty OrderedDict)",
          Status::unsupported);
    TensorRecord t;
    t.storage = size_t(objs_[a[0]].i);
    t.offset = uint64_t(integer(a[1], "the storage offset", 0));
    const Obj& size = as(a[2], Obj::tuple, "the size");
    const Obj& stride = as(a[3], Obj::tuple, "the stride");
    if (size.items.size() != stride.items.size() || size.items.size() > kMaxDims)
      bad("size of " + std::to_string(size.items.size()) + " dimensions with a stride of " +
          std::to_string(stride.items.size()) + "; expected the same count, at most 8");
    const uint64_t storage_numel = sd_.storages[t.storage].numel;
    t.numel = 1;
    uint64_t last = t.offset;  // the largest element index the view reaches
    for (size_t d = 0; d < size.items.size(); ++d) {
      const uint64_t n = uint64_t(integer(size.items[d], "a size", 0)), s = uint64_t(integer(stride.items[d], "a stride", 0));
      t.shape.push_back(int64_t(n));
      t.stride.push_back(int64_t(s));
      if (n == 0) t.numel = 0;
      else if (t.numel && t.numel > kMaxElements / n) bad("a tensor of more than 2^62 elements");
      else t.numel *= n;
      if (n > 0 && s > 0 && (s > kMaxElements / n || last > kMaxElements - (n - 1) * s)) bad("a stride past 2^62 elements");
      if (n > 0) last += (n - 1) * s;
    }
    if (t.numel > 0 && (last >= storage_numel || t.numel > storage_numel))
      bad("a tensor of " + std::to_string(t.numel) + " elements reaching element " + std::to_string(last) +
          " of a storage of " + std::to_string(storage_numel) + " (out of bounds, or an expanded view)");
    sd_.tensors.push_back(std::move(t));
    return make(Obj{Obj::tensor, int64_t(sd_.tensors.size() - 1), {}, {}});
  }

  // Where the pickle holds a dict that is no state_dict: its keys (those read so far, when it is
  // still being built) and what to save instead. `root`: the finished dict; by default the first
  // object on the stack when it is a plain dict (a state_dict is an OrderedDict), else "".
  std::string checkpoint_hint(uint32_t root = UINT32_MAX) const {
    std::vector<uint32_t> items;  // key, value, key, value, ... (the last value may be missing)
    if (root == UINT32_MAX) {
      if (stack_.empty() || objs_[stack_[0]].kind != Obj::dict || objs_[stack_[0]].i != 1) return "";
      root = stack_[0];
      items = objs_[root].items;
      // Items not yet set: on the stack above the dict, up to the next mark.
      const size_t from = marks_.empty() ? 1 : marks_[0];
      const size_t to = marks_.size() > 1 ? marks_[1] : stack_.size();
      if (from >= 1) items.insert(items.end(), stack_.begin() + std::ptrdiff_t(std::min(from, to)),
                                  stack_.begin() + std::ptrdiff_t(to));
    } else {
      items = objs_[root].items;
    }
    std::string keys, inner;
    size_t shown = 0;
    for (size_t k = 0; k < items.size(); k += 2) {
      const Obj& key = objs_[items[k]];
      if (key.kind != Obj::text) continue;
      if (shown++ < 20) keys += (keys.empty() ? "'" : ", '") + printable(key.s, 64) + "'";
      if (inner.empty() && k + 1 < items.size() && objs_[items[k + 1]].kind == Obj::dict) inner = printable(key.s, 64);
    }
    if (shown > 20) keys += ", ... (" + std::to_string(shown) + " keys)";
    if (keys.empty()) return "";
    return "; the file holds a dict with the keys " + keys +
           " (a training checkpoint?): dfp reads a file of torch.save(model.state_dict(), path), so save the "
           "model's state_dict alone" +
           (inner.empty() ? std::string() : ", e.g. torch.save(checkpoint['" + inner + "'], path)");
  }

  StateDict result(uint32_t root) {
    op_at_ = pos_ - 1;
    const Obj& d = objs_[root];
    if (d.kind != Obj::dict)
      bad("the file holds " + std::string(kind_name(d.kind)) + "; expected a state_dict (a dict of tensors)",
          Status::unsupported);
    StateDict out;
    out.storages = sd_.storages;
    std::unordered_map<std::string, size_t> names;
    for (size_t k = 0; k < d.items.size(); k += 2) {
      const Obj& key = objs_[d.items[k]];
      const Obj& value = objs_[d.items[k + 1]];
      if (key.kind != Obj::text) bad("a state_dict key is " + std::string(kind_name(key.kind)) + "; expected a str",
                                     Status::unsupported);
      // Python writes a str as UTF-8: other bytes are damage (and no name a caller could match).
      if (!valid_utf8(key.s))
        bad("state_dict key '" + printable(key.s) + "' is not valid UTF-8; expected a str as Python writes it");
      if (value.kind != Obj::tensor)
        bad("state_dict entry '" + printable(key.s) + "' is " + kind_name(value.kind) + " (a training checkpoint rather than " +
                "model.state_dict()?); expected a tensor" + checkpoint_hint(root),
            Status::unsupported);
      if (!names.emplace(key.s, k).second) bad("state_dict key '" + printable(key.s) + "' appears twice");
      out.tensors.push_back(sd_.tensors[size_t(value.i)]);
      out.tensors.back().name = key.s;
    }
    return out;
  }

  std::string_view p_;
  const std::string& what_;
  size_t pos_ = 0, op_at_ = 0;
  unsigned char op_ = 0;
  std::vector<Obj> objs_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::unordered_map<std::string, size_t> storage_index_;
  StateDict sd_;
};

void put_uint(std::string& o, uint64_t v, size_t n) {
  for (size_t k = 0; k < n; ++k) o += char(v >> (8 * k) & 0xFF);
}
void put_int(std::string& o, uint64_t v) {
  if (v < 0x100) o += 'K', put_uint(o, v, 1);
  else if (v < 0x10000) o += 'M', put_uint(o, v, 2);
  else if (v < 0x80000000u) o += 'J', put_uint(o, v, 4);
  else o += '\x8a', o += char(8), put_uint(o, v, 8);  // LONG1, 8 bytes (v < 2^63)
}
void put_text(std::string& o, const std::string& s) { o += 'X', put_uint(o, s.size(), 4), o += s; }
void put_ints(std::string& o, const std::vector<int64_t>& v) {
  o += '(';
  for (int64_t x : v) put_int(o, uint64_t(x));
  o += 't';
}

}  // namespace

StateDict parse_state_dict(std::string_view pickle, const std::string& what) { return Reader(pickle, what).run(); }

std::string state_dict_pickle(const StateDict& sd) {
  static const char* storage_type[] = {"FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage"};
  std::string o = "\x80\x02";
  o += "ccollections\nOrderedDict\nq\x00)R("s;  // memo 0: OrderedDict (also the empty hooks below)
  for (size_t i = 0; i < sd.tensors.size(); ++i) {
    const TensorRecord& t = sd.tensors[i];
    const StorageRef& s = sd.storages[t.storage];
    put_text(o, t.name);
    o += "ctorch._utils\n_rebuild_tensor_v2\n((";
    put_text(o, "storage");
    o += std::string("ctorch\n") + storage_type[int(s.dtype)] + "\n";
    put_text(o, s.key);
    put_text(o, "cpu");
    put_int(o, s.numel);
    o += "tQ";  // the persistent id tuple, BINPERSID
    put_int(o, t.offset);
    put_ints(o, t.shape);
    put_ints(o, t.stride);
    o += "\x89h\x00)R" "tR"s;  // requires_grad False, OrderedDict() hooks; the argument tuple, REDUCE
    if (i % 1000 == 999) o += "u(";  // SETITEMS in batches, as pickle writes them
  }
  o += "u.";
  return o;
}

}  // namespace dfp::torch_format
