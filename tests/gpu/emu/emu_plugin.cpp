/* An emulated build of a GPU plugin: src/gpu/nvidia/plugin.cu (or src/gpu/amd/plugin.hip), host code and
 * kernels, compiled unchanged as host C++ for the target that -DEMU_TARGET_* names, with
 * FA_GPU_EMULATOR="emu_runtime.h" (see emu_runtime.h). The result is a plugin with the real
 * file name (libflashattn-cuda.so, libflashattn-hip.so) in a folder of its own, which the
 * registry loads through FLASHATTN_PLUGIN_DIR, so tests/gpu/test_gpu_backends.c runs on it as it
 * would on a GPU. The HIP targets are compiled as hipcc compiles them: __HIPCC__ and the
 * target's wavefront size. */
#if defined(EMU_TARGET_HIP_CDNA)
#  define __HIPCC__ 1
#  define __AMDGCN_WAVEFRONT_SIZE 64
#elif defined(EMU_TARGET_HIP_RDNA)
#  define __HIPCC__ 1
#  define __AMDGCN_WAVEFRONT_SIZE 32
#endif

#if defined(__HIPCC__)
#  define FA_HIP_TARGETS "gfx90a", "gfx908", "gfx1030"
#  include "gpu/amd/plugin.hip"
#else
#  include "gpu/nvidia/plugin.cu"
#endif

/* Stream capture for the tests (emu_runtime.h), reached through dlsym on the loaded plugin. */
#define FA_EMU_EXPORT extern "C" __attribute__((visibility("default")))

/* Starts recording the launches on stream (not NULL); 0, or -1 when a capture is already open. */
FA_EMU_EXPORT int fa_emu_begin_capture(void *stream)
{
    emu_capture_state &c = emu_capture();
    if (!stream || c.stream) return -1;
    c.stream = (fa_gpu_stream)stream;
    c.violation[0] = '\0';
    c.graph.clear();
    return 0;
}

/* Ends the capture: the launches recorded, or -1 with the first refused operation in why. */
FA_EMU_EXPORT int fa_emu_end_capture(char *why, size_t size)
{
    emu_capture_state &c = emu_capture();
    c.stream = NULL;
    if (size) snprintf(why, size, "%s", c.violation);
    return c.violation[0] ? -1 : (int)c.graph.size();
}

/* Runs the recorded graph once, launch by launch in capture order; the launches run. */
FA_EMU_EXPORT int fa_emu_replay(void)
{
    emu_capture_state &c = emu_capture();
    for (const emu_recorded_launch &r : c.graph) ::emu::run(r.l);
    return (int)c.graph.size();
}
