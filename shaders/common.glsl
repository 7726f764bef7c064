// common.glsl: what every kiln kernel shares.
//
// Tensors are reached through 64-bit device addresses that the runtime puts
// in push constants (up to 16 of them, 128 bytes), declared per kernel as
// `layout(push_constant) uniform Args { F32 out_; F32R in0; ... } args;`.
// Within one dispatch an output never shares bytes with an input (the memory
// planner guarantees it), so inputs are restrict and readonly.
#extension GL_EXT_buffer_reference : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 {
    float v[];
};
layout(buffer_reference, std430, buffer_reference_align = 4) restrict readonly buffer F32R {
    float v[];
};

float kiln_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// tanh without overflow: exp of a non-positive argument only.
float kiln_tanh(float x) {
    if (abs(x) < 0.5)
        return tanh(x);
    float e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// erf, Abramowitz and Stegun 7.1.26: absolute error below 1.5e-7.
float kiln_erf(float x) {
    float t = 1.0 / (1.0 + 0.3275911 * abs(x));
    float p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 +
              t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - p * exp(-x * x));
}

// gelu with erf (exact form): x * Phi(x).
float kiln_gelu(float x) { return 0.5 * x * (1.0 + kiln_erf(x * 0.70710678118654752)); }
