#include "train/tensorboard/summaries.h"

#include "event.pb.h"
#include "hparams.pb.h"
#include "summary.pb.h"

namespace ddp::tensorboard {

namespace {

Event event_at(When when) {
  Event e;
  e.set_wall_time(when.wall_time);
  e.set_step(when.step);
  return e;
}

std::string serialised(const Event& e) {
  std::string out;
  e.SerializeToString(&out);
  return out;
}

// A Summary.Value with only a tag and the plugin's metadata (the HParams
// records carry everything in the metadata's content).
std::string plugin_event(const std::string& tag, const std::string& plugin, const std::string& content, When when) {
  Event e = event_at(when);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* data = v->mutable_metadata()->mutable_plugin_data();
  data->set_plugin_name(plugin);
  data->set_content(content);
  return serialised(e);
}

std::string hparams_content(const hparams::HParamsPluginData& d) {
  std::string out;
  d.SerializeToString(&out);
  return out;
}

}  // namespace

std::string file_version_event(When when, bool first) {
  Event e = event_at(when);
  e.set_file_version("brain.Event:2");
  if (first) e.mutable_source_metadata()->set_writer("ddp.SummaryWriter");
  return serialised(e);
}

std::string session_start_event(When when) {
  Event e = event_at(when);
  e.mutable_session_log()->set_status(SessionLog::START);
  return serialised(e);
}

std::string scalar_event(const std::string& tag, double value, When when) {
  Event e = event_at(when);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  return serialised(e);
}

std::string histogram_event(const std::string& tag, const Histogram& h, When when) {
  Event e = event_at(when);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double l : h.bucket_limit) p->add_bucket_limit(l);
  for (double c : h.bucket) p->add_bucket(c);
  return serialised(e);
}

std::string text_event(const std::string& tag, const std::string& text, When when) {
  Event e = event_at(when);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag + "/text_summary");
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");  // content: TextPluginData{version 0}, empty
  auto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
  return serialised(e);
}

std::vector<std::string> hparams_events(const std::map<std::string, std::variant<double, std::string>>& values,
                                        const std::map<std::string, double>& metrics, When when) {
  hparams::HParamsPluginData experiment, start, end;
  auto* exp = experiment.mutable_experiment();
  auto* ssi = start.mutable_session_start_info();
  for (const auto& [name, value] : values) {
    auto* info = exp->add_hparam_infos();
    info->set_name(name);
    auto& v = (*ssi->mutable_hparams())[name];
    if (const auto* number = std::get_if<double>(&value)) {
      info->set_type(hparams::DATA_TYPE_FLOAT64);
      v.set_number_value(*number);
    } else {
      info->set_type(hparams::DATA_TYPE_STRING);
      v.set_string_value(std::get<std::string>(value));
    }
  }
  for (const auto& m : metrics) exp->add_metric_infos()->mutable_name()->set_tag(m.first);
  end.mutable_session_end_info()->set_status(hparams::STATUS_SUCCESS);
  return {plugin_event("_hparams_/experiment", "hparams", hparams_content(experiment), when),
          plugin_event("_hparams_/session_start_info", "hparams", hparams_content(start), when),
          plugin_event("_hparams_/session_end_info", "hparams", hparams_content(end), when)};
}

}  // namespace ddp::tensorboard
