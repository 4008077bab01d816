//! `#[handler(capability = "...", version = "...")]`: turns an async function
//! `async fn f(ctx: Ctx, input: In) -> Result<Out, HandlerError>` into a value
//! the SDK can register. The function keeps its body; a unit struct of the same
//! name implements `agent_reach_sdk::IntoHandler`, so `agent.handler(f)` works
//! and the descriptor's schemas are derived from `In` and `Out`.

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, Meta, Token};

#[proc_macro_attribute]
pub fn handler(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

fn string_value(expr: &Expr) -> syn::Result<String> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(text), ..
        }) => Ok(text.value()),
        other => Err(syn::Error::new_spanned(other, "expected a string literal")),
    }
}

fn expand(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> syn::Result<proc_macro2::TokenStream> {
    let function: ItemFn = syn::parse2(item)?;
    let arguments = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr)?;
    let (mut capability, mut version, mut description, mut timeout_ms) = (None, None, None, None);
    for argument in &arguments {
        let Meta::NameValue(pair) = argument else {
            return Err(syn::Error::new_spanned(argument, "expected `key = value`"));
        };
        let key = pair.path.get_ident().map(ToString::to_string).unwrap_or_default();
        match key.as_str() {
            "capability" => capability = Some(string_value(&pair.value)?),
            "version" => version = Some(string_value(&pair.value)?),
            "description" => description = Some(string_value(&pair.value)?),
            "timeout_ms" => match &pair.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Int(number), ..
                }) => timeout_ms = Some(number.base10_parse::<u64>()?),
                other => return Err(syn::Error::new_spanned(other, "expected an integer")),
            },
            _ => {
                return Err(syn::Error::new_spanned(
                    &pair.path,
                    "unknown argument; use capability, version, description, timeout_ms",
                ))
            }
        }
    }
    let capability =
        capability.ok_or_else(|| syn::Error::new_spanned(&function.sig, "missing `capability = \"...\"`"))?;
    let version = version.ok_or_else(|| syn::Error::new_spanned(&function.sig, "missing `version = \"...\"`"))?;
    if function.sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            &function.sig,
            "a handler must be an `async fn`",
        ));
    }
    if function.sig.inputs.len() != 2 {
        return Err(syn::Error::new_spanned(
            &function.sig.inputs,
            "a handler takes exactly two arguments: (ctx: Ctx, input: YourInput)",
        ));
    }
    let visibility = &function.vis;
    let name = &function.sig.ident;
    let docs: Vec<_> = function
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("doc"))
        .collect();
    let description = description.map(|text| quote! { .description(#text) });
    let timeout = timeout_ms.map(|ms| quote! { .timeout_ms(#ms) });
    Ok(quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy)]
        #visibility struct #name;

        impl ::agent_reach_sdk::IntoHandler for #name {
            fn into_handler(self) -> ::agent_reach_sdk::Handler {
                #function
                ::agent_reach_sdk::Handler::new(#capability, #version, #name) #description #timeout
            }
        }
    })
}
